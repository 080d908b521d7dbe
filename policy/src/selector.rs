//! Calico's selector language: parse, evaluate, print.
//!
//! The grammar and the meaning of every operator follow Calico's own parser
//! (`libcalico-go/lib/selector/{tokenizer,parser}`) and the policy reference:
//!
//! ```text
//! or    := and ("||" and)*
//! and   := op ("&&" op)*
//! op    := "!"* ( "(" or ")" | "all()" | "global()" | "has(" label ")"
//!               | label ("==" | "!=" | "contains" | "starts with" | "ends with") string
//!               | label ("in" | "not in") "{" [string ("," string)*] "}" )
//! label := [A-Za-z0-9_./-]+        string := '...' | "..." (no escapes)
//! ```
//!
//! `!=` and `not in` are true when the label is absent; `!` binds tighter
//! than `&&`, which binds tighter than `||`; the empty selector is `all()`.
//! `global()` is only meaningful in a rule's `namespaceSelector`, where it
//! selects the non-namespaced entities (global network sets) and `all()`
//! selects every namespaced one ([`Selector::matches_namespace`]).
//!
//! Parsing never panics and bounds its recursion ([`MAX_DEPTH`]), so
//! untrusted selectors are safe to parse (there is a fuzz target).

use std::collections::{BTreeMap, HashMap};
use std::fmt;
use std::str::FromStr;

/// Longest selector accepted, in bytes.
pub const MAX_SELECTOR_LEN: usize = 16 * 1024;
/// Longest label name, as Calico's tokenizer allows.
pub const MAX_LABEL_LEN: usize = 512;
/// Deepest nesting of parentheses and negations.
pub const MAX_DEPTH: usize = 64;

/// Something with labels a selector can be evaluated against.
pub trait Labels {
    /// The value of label `key`, if present.
    fn get(&self, key: &str) -> Option<&str>;
}

impl Labels for BTreeMap<String, String> {
    fn get(&self, key: &str) -> Option<&str> {
        BTreeMap::get(self, key).map(String::as_str)
    }
}

impl<S: std::hash::BuildHasher> Labels for HashMap<String, String, S> {
    fn get(&self, key: &str) -> Option<&str> {
        HashMap::get(self, key).map(String::as_str)
    }
}

impl<L: Labels + ?Sized> Labels for &L {
    fn get(&self, key: &str) -> Option<&str> {
        (**self).get(key)
    }
}

/// No labels at all.
#[derive(Debug, Clone, Copy, Default)]
pub struct NoLabels;

impl Labels for NoLabels {
    fn get(&self, _key: &str) -> Option<&str> {
        None
    }
}

/// Two label maps seen as one, the first winning (an endpoint's own labels
/// over the implicit ones the compiler adds).
#[derive(Debug, Clone, Copy)]
pub struct Layered<A, B>(pub A, pub B);

impl<A: Labels, B: Labels> Labels for Layered<A, B> {
    fn get(&self, key: &str) -> Option<&str> {
        self.0.get(key).or_else(|| self.1.get(key))
    }
}

/// A parsed selector expression. Equal selectors (after normalisation:
/// flattened `&&`/`||`, sorted and deduplicated `in` sets, collapsed double
/// negation) compare equal and hash equal, which is what lets the compiler
/// share one IP set between every rule that selects the same endpoints.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Expr {
    /// `all()`.
    All,
    /// `global()`.
    Global,
    /// `has(label)`.
    Has(String),
    /// `label == "value"`.
    Eq(String, String),
    /// `label != "value"` (true when absent).
    Ne(String, String),
    /// `label in {...}` (values sorted, deduplicated).
    In(String, Vec<String>),
    /// `label not in {...}` (true when absent).
    NotIn(String, Vec<String>),
    /// `label contains "s"`.
    Contains(String, String),
    /// `label starts with "s"`.
    StartsWith(String, String),
    /// `label ends with "s"`.
    EndsWith(String, String),
    /// `!expr`.
    Not(Box<Expr>),
    /// `a && b && ...` (at least two terms, none an `And`).
    And(Vec<Expr>),
    /// `a || b || ...` (at least two terms, none an `Or`).
    Or(Vec<Expr>),
}

/// How `all()` and `global()` evaluate: in an ordinary selector both are
/// true (Calico's `AllNode` and `GlobalNode`); in a namespace selector they
/// tell namespaced entities from global ones.
#[derive(Debug, Clone, Copy)]
struct Scope {
    all: bool,
    global: bool,
}

impl Expr {
    fn eval(&self, labels: &dyn Labels, scope: Scope) -> bool {
        match self {
            Expr::All => scope.all,
            Expr::Global => scope.global,
            Expr::Has(k) => labels.get(k).is_some(),
            Expr::Eq(k, v) => labels.get(k) == Some(v.as_str()),
            Expr::Ne(k, v) => labels.get(k) != Some(v.as_str()),
            Expr::In(k, vs) => labels
                .get(k)
                .is_some_and(|v| vs.binary_search_by(|x| x.as_str().cmp(v)).is_ok()),
            Expr::NotIn(k, vs) => labels
                .get(k)
                .is_none_or(|v| vs.binary_search_by(|x| x.as_str().cmp(v)).is_err()),
            Expr::Contains(k, s) => labels.get(k).is_some_and(|v| v.contains(s.as_str())),
            Expr::StartsWith(k, s) => labels.get(k).is_some_and(|v| v.starts_with(s.as_str())),
            Expr::EndsWith(k, s) => labels.get(k).is_some_and(|v| v.ends_with(s.as_str())),
            Expr::Not(e) => !e.eval(labels, scope),
            Expr::And(es) => es.iter().all(|e| e.eval(labels, scope)),
            Expr::Or(es) => es.iter().any(|e| e.eval(labels, scope)),
        }
    }

    fn uses_global(&self) -> bool {
        match self {
            Expr::Global => true,
            Expr::Not(e) => e.uses_global(),
            Expr::And(es) | Expr::Or(es) => es.iter().any(Expr::uses_global),
            _ => false,
        }
    }

    /// `a && b`, flattening.
    fn and(self, other: Expr) -> Expr {
        let mut terms = Vec::new();
        for e in [self, other] {
            match e {
                Expr::And(es) => terms.extend(es),
                e => terms.push(e),
            }
        }
        Expr::And(terms)
    }
}

/// A selector: an [`Expr`] plus the evaluation entry points.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Selector {
    expr: Expr,
}

impl Selector {
    /// `all()`.
    pub fn all() -> Selector {
        Selector { expr: Expr::All }
    }

    /// Parses `input`; empty (or blank) is `all()`.
    pub fn parse(input: &str) -> Result<Selector, SelectorError> {
        if input.len() > MAX_SELECTOR_LEN {
            return Err(SelectorError::new(0, Problem::TooLong));
        }
        let tokens = tokenize(input)?;
        if tokens.len() == 1 {
            return Ok(Selector::all());
        }
        let mut p = Parser { tokens, at: 0 };
        let expr = p.or(0)?;
        match p.peek() {
            Tok::Eof => Ok(Selector { expr }),
            _ => Err(SelectorError::new(p.offset(), Problem::TrailingInput)),
        }
    }

    /// Builds a selector from an expression (normalised as the parser does).
    pub fn from_expr(expr: Expr) -> Selector {
        Selector {
            expr: normalize(expr),
        }
    }

    /// The expression.
    pub fn expr(&self) -> &Expr {
        &self.expr
    }

    /// Whether this is `all()`.
    pub fn is_all(&self) -> bool {
        self.expr == Expr::All
    }

    /// Whether `global()` occurs anywhere (only valid in a rule's
    /// namespace selector).
    pub fn uses_global(&self) -> bool {
        self.expr.uses_global()
    }

    /// `self && other`.
    pub fn and(&self, other: &Selector) -> Selector {
        match (&self.expr, &other.expr) {
            (Expr::All, _) => other.clone(),
            (_, Expr::All) => self.clone(),
            _ => Selector::from_expr(self.expr.clone().and(other.expr.clone())),
        }
    }

    /// Evaluates against an entity's labels (`all()` and `global()` true).
    pub fn matches(&self, labels: &dyn Labels) -> bool {
        self.expr.eval(
            labels,
            Scope {
                all: true,
                global: true,
            },
        )
    }

    /// Evaluates as a rule's namespace selector: `Some(labels)` for an
    /// entity in a namespace with those labels (`all()` true, `global()`
    /// false), `None` for a global entity (a global network set: no labels,
    /// `all()` false, `global()` true). This is exactly what Calico's
    /// rewrite of `all()` to `has(projectcalico.org/namespace)` and of
    /// `global()` to `!has(projectcalico.org/namespace)` over `pcns.`
    /// prefixed labels evaluates to.
    pub fn matches_namespace(&self, namespace_labels: Option<&dyn Labels>) -> bool {
        match namespace_labels {
            Some(labels) => self.expr.eval(
                labels,
                Scope {
                    all: true,
                    global: false,
                },
            ),
            None => self.expr.eval(
                &NoLabels,
                Scope {
                    all: false,
                    global: true,
                },
            ),
        }
    }
}

impl FromStr for Selector {
    type Err = SelectorError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Selector::parse(s)
    }
}

impl Default for Selector {
    fn default() -> Self {
        Selector::all()
    }
}

impl fmt::Display for Selector {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.expr)
    }
}

fn quote(f: &mut fmt::Formatter<'_>, s: &str) -> fmt::Result {
    if s.contains('"') {
        write!(f, "'{s}'")
    } else {
        write!(f, "\"{s}\"")
    }
}

impl fmt::Display for Expr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Expr::All => f.write_str("all()"),
            Expr::Global => f.write_str("global()"),
            Expr::Has(k) => write!(f, "has({k})"),
            Expr::Eq(k, v) => {
                write!(f, "{k} == ")?;
                quote(f, v)
            }
            Expr::Ne(k, v) => {
                write!(f, "{k} != ")?;
                quote(f, v)
            }
            Expr::Contains(k, v) => {
                write!(f, "{k} contains ")?;
                quote(f, v)
            }
            Expr::StartsWith(k, v) => {
                write!(f, "{k} starts with ")?;
                quote(f, v)
            }
            Expr::EndsWith(k, v) => {
                write!(f, "{k} ends with ")?;
                quote(f, v)
            }
            Expr::In(k, vs) | Expr::NotIn(k, vs) => {
                let op = if matches!(self, Expr::In(..)) {
                    "in"
                } else {
                    "not in"
                };
                write!(f, "{k} {op} {{")?;
                for (i, v) in vs.iter().enumerate() {
                    if i > 0 {
                        f.write_str(", ")?;
                    }
                    quote(f, v)?;
                }
                f.write_str("}")
            }
            Expr::Not(e) => match **e {
                Expr::And(_) | Expr::Or(_) => write!(f, "!({e})"),
                _ => write!(f, "!{e}"),
            },
            Expr::And(es) => {
                for (i, e) in es.iter().enumerate() {
                    if i > 0 {
                        f.write_str(" && ")?;
                    }
                    match e {
                        Expr::Or(_) => write!(f, "({e})")?,
                        _ => write!(f, "{e}")?,
                    }
                }
                Ok(())
            }
            Expr::Or(es) => {
                for (i, e) in es.iter().enumerate() {
                    if i > 0 {
                        f.write_str(" || ")?;
                    }
                    write!(f, "{e}")?;
                }
                Ok(())
            }
        }
    }
}

fn normalize(expr: Expr) -> Expr {
    match expr {
        Expr::In(k, mut vs) => {
            vs.sort();
            vs.dedup();
            Expr::In(k, vs)
        }
        Expr::NotIn(k, mut vs) => {
            vs.sort();
            vs.dedup();
            Expr::NotIn(k, vs)
        }
        Expr::Not(e) => match normalize(*e) {
            Expr::Not(inner) => *inner,
            e => Expr::Not(Box::new(e)),
        },
        Expr::And(es) => {
            let mut out = Vec::with_capacity(es.len());
            for e in es {
                match normalize(e) {
                    Expr::And(inner) => out.extend(inner),
                    e => out.push(e),
                }
            }
            if out.len() == 1 {
                out.pop().unwrap_or(Expr::All)
            } else if out.is_empty() {
                Expr::All
            } else {
                Expr::And(out)
            }
        }
        Expr::Or(es) => {
            let mut out = Vec::with_capacity(es.len());
            for e in es {
                match normalize(e) {
                    Expr::Or(inner) => out.extend(inner),
                    e => out.push(e),
                }
            }
            if out.len() == 1 {
                out.pop().unwrap_or(Expr::All)
            } else if out.is_empty() {
                Expr::Not(Box::new(Expr::All))
            } else {
                Expr::Or(out)
            }
        }
        e => e,
    }
}

/// Why a selector did not parse, and where (byte offset into the input).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("selector error at byte {offset}: {problem}")]
pub struct SelectorError {
    /// Byte offset of the problem.
    pub offset: usize,
    /// What is wrong.
    pub problem: Problem,
}

impl SelectorError {
    fn new(offset: usize, problem: Problem) -> SelectorError {
        SelectorError { offset, problem }
    }
}

/// What is wrong with a selector.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Problem {
    /// Longer than [`MAX_SELECTOR_LEN`].
    #[error("longer than {MAX_SELECTOR_LEN} bytes")]
    TooLong,
    /// Nested deeper than [`MAX_DEPTH`].
    #[error("nested deeper than {MAX_DEPTH}")]
    TooDeep,
    /// A quoted string without its closing quote.
    #[error("unterminated string")]
    UnterminatedString,
    /// A label name longer than [`MAX_LABEL_LEN`].
    #[error("label longer than {MAX_LABEL_LEN} bytes")]
    LabelTooLong,
    /// A character that starts no token.
    #[error("unexpected character {0:?}")]
    UnexpectedChar(char),
    /// `=` not followed by `=`, `&` not by `&`, `|` not by `|`.
    #[error("expected {0:?}")]
    Expected(&'static str),
    /// A label not followed by an operator.
    #[error("expected an operator after label {0:?}")]
    ExpectedOperator(String),
    /// `has(` or `all(` or `global(` without its `)`.
    #[error("expected ')' to close {0}")]
    UnclosedCall(&'static str),
    /// An operator wanting a quoted string got something else.
    #[error("expected a quoted string")]
    ExpectedString,
    /// `in` / `not in` not followed by `{`.
    #[error("expected a set literal {{...}}")]
    ExpectedSet,
    /// A set literal without its `}`.
    #[error("expected '}}'")]
    ExpectedRBrace,
    /// A parenthesised expression without its `)`.
    #[error("expected ')'")]
    ExpectedRParen,
    /// The input ended where an operation was expected.
    #[error("unexpected end of selector")]
    UnexpectedEnd,
    /// A token where an operation was expected.
    #[error("unexpected {0}")]
    UnexpectedToken(&'static str),
    /// Content after a complete expression.
    #[error("unexpected content after the expression")]
    TrailingInput,
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Tok {
    Label(String),
    Str(String),
    LBrace,
    RBrace,
    Comma,
    Eq,
    Ne,
    In,
    NotIn,
    Contains,
    StartsWith,
    EndsWith,
    Not,
    All,
    Global,
    Has(String),
    LParen,
    RParen,
    And,
    Or,
    Eof,
}

impl Tok {
    fn describe(&self) -> &'static str {
        match self {
            Tok::Label(_) => "label",
            Tok::Str(_) => "string",
            Tok::LBrace => "'{'",
            Tok::RBrace => "'}'",
            Tok::Comma => "','",
            Tok::Eq => "'=='",
            Tok::Ne => "'!='",
            Tok::In => "'in'",
            Tok::NotIn => "'not in'",
            Tok::Contains => "'contains'",
            Tok::StartsWith => "'starts with'",
            Tok::EndsWith => "'ends with'",
            Tok::Not => "'!'",
            Tok::All => "'all()'",
            Tok::Global => "'global()'",
            Tok::Has(_) => "'has()'",
            Tok::LParen => "'('",
            Tok::RParen => "')'",
            Tok::And => "'&&'",
            Tok::Or => "'||'",
            Tok::Eof => "end of selector",
        }
    }
}

fn is_label_byte(b: u8) -> bool {
    b.is_ascii_alphanumeric() || matches!(b, b'_' | b'.' | b'/' | b'-')
}

/// Splits off a label at the start of `s` (after `at` bytes of input).
fn cut_label(s: &str, at: usize) -> Result<(&str, &str), SelectorError> {
    let end = s.bytes().position(|b| !is_label_byte(b)).unwrap_or(s.len());
    if end == 0 {
        let c = s.chars().next();
        return Err(SelectorError::new(
            at,
            c.map_or(Problem::UnexpectedEnd, Problem::UnexpectedChar),
        ));
    }
    if end > MAX_LABEL_LEN {
        return Err(SelectorError::new(at, Problem::LabelTooLong));
    }
    Ok(s.split_at(end))
}

/// `word` at the start of `s`, followed by a word boundary.
fn cut_word<'a>(s: &'a str, word: &str) -> Option<&'a str> {
    let rest = s.strip_prefix(word)?;
    match rest.bytes().next() {
        Some(b) if is_label_byte(b) => None,
        _ => Some(rest),
    }
}

/// Two words separated by optional whitespace ("not in", "starts with").
fn cut_words<'a>(s: &'a str, first: &str, second: &str) -> Option<&'a str> {
    let rest = s.strip_prefix(first)?;
    cut_word(rest.trim_start(), second)
}

/// `name(` ws `)` at the start of `s`.
fn cut_call<'a>(s: &'a str, name: &str) -> Option<Result<&'a str, ()>> {
    let rest = s.strip_prefix(name)?.strip_prefix('(')?;
    Some(rest.trim_start().strip_prefix(')').ok_or(()))
}

fn tokenize(input: &str) -> Result<Vec<(Tok, usize)>, SelectorError> {
    let mut out: Vec<(Tok, usize)> = Vec::new();
    let mut s = input;
    loop {
        s = s.trim_start();
        let at = input.len() - s.len();
        let Some(c) = s.chars().next() else {
            out.push((Tok::Eof, at));
            return Ok(out);
        };
        let after_label = matches!(out.last(), Some((Tok::Label(_), _)));
        let (tok, rest) = match c {
            '(' => (Tok::LParen, &s[1..]),
            ')' => (Tok::RParen, &s[1..]),
            '{' => (Tok::LBrace, &s[1..]),
            '}' => (Tok::RBrace, &s[1..]),
            ',' => (Tok::Comma, &s[1..]),
            '"' | '\'' => {
                let body = &s[1..];
                let end = body
                    .find(c)
                    .ok_or_else(|| SelectorError::new(at, Problem::UnterminatedString))?;
                (Tok::Str(body[..end].to_owned()), &body[end + 1..])
            }
            '=' => match s.strip_prefix("==") {
                Some(r) => (Tok::Eq, r),
                None => return Err(SelectorError::new(at, Problem::Expected("=="))),
            },
            '!' => match s.strip_prefix("!=") {
                Some(r) => (Tok::Ne, r),
                None => (Tok::Not, &s[1..]),
            },
            '&' => match s.strip_prefix("&&") {
                Some(r) => (Tok::And, r),
                None => return Err(SelectorError::new(at, Problem::Expected("&&"))),
            },
            '|' => match s.strip_prefix("||") {
                Some(r) => (Tok::Or, r),
                None => return Err(SelectorError::new(at, Problem::Expected("||"))),
            },
            _ if after_label => {
                if let Some(r) = cut_word(s, "contains") {
                    (Tok::Contains, r)
                } else if let Some(r) = cut_words(s, "starts", "with") {
                    (Tok::StartsWith, r)
                } else if let Some(r) = cut_words(s, "ends", "with") {
                    (Tok::EndsWith, r)
                } else if let Some(r) = cut_words(s, "not", "in") {
                    (Tok::NotIn, r)
                } else if let Some(r) = cut_word(s, "in") {
                    (Tok::In, r)
                } else {
                    let label = match out.last() {
                        Some((Tok::Label(l), _)) => l.clone(),
                        _ => String::new(),
                    };
                    return Err(SelectorError::new(at, Problem::ExpectedOperator(label)));
                }
            }
            _ => {
                if let Some(r) = s.strip_prefix("has(") {
                    let r = r.trim_start();
                    let label_at = input.len() - r.len();
                    let (label, r) = cut_label(r, label_at)?;
                    match r.trim_start().strip_prefix(')') {
                        Some(r) => (Tok::Has(label.to_owned()), r),
                        None => return Err(SelectorError::new(at, Problem::UnclosedCall("has("))),
                    }
                } else if let Some(r) = cut_call(s, "all") {
                    match r {
                        Ok(r) => (Tok::All, r),
                        Err(()) => {
                            return Err(SelectorError::new(at, Problem::UnclosedCall("all(")));
                        }
                    }
                } else if let Some(r) = cut_call(s, "global") {
                    match r {
                        Ok(r) => (Tok::Global, r),
                        Err(()) => {
                            return Err(SelectorError::new(at, Problem::UnclosedCall("global(")));
                        }
                    }
                } else {
                    let (label, r) = cut_label(s, at)?;
                    (Tok::Label(label.to_owned()), r)
                }
            }
        };
        out.push((tok, at));
        s = rest;
    }
}

struct Parser {
    tokens: Vec<(Tok, usize)>,
    at: usize,
}

impl Parser {
    fn peek(&self) -> &Tok {
        // The token list always ends with Eof and `at` never passes it.
        &self.tokens[self.at.min(self.tokens.len() - 1)].0
    }

    fn offset(&self) -> usize {
        self.tokens[self.at.min(self.tokens.len() - 1)].1
    }

    fn next(&mut self) -> Tok {
        let t = self.peek().clone();
        if t != Tok::Eof {
            self.at += 1;
        }
        t
    }

    fn or(&mut self, depth: usize) -> Result<Expr, SelectorError> {
        let mut terms = vec![self.and(depth)?];
        while *self.peek() == Tok::Or {
            self.next();
            terms.push(self.and(depth)?);
        }
        Ok(normalize(if terms.len() == 1 {
            terms.remove(0)
        } else {
            Expr::Or(terms)
        }))
    }

    fn and(&mut self, depth: usize) -> Result<Expr, SelectorError> {
        let mut terms = vec![self.op(depth)?];
        while *self.peek() == Tok::And {
            self.next();
            terms.push(self.op(depth)?);
        }
        Ok(if terms.len() == 1 {
            terms.remove(0)
        } else {
            Expr::And(terms)
        })
    }

    fn string(&mut self) -> Result<String, SelectorError> {
        let at = self.offset();
        match self.next() {
            Tok::Str(s) => Ok(s),
            _ => Err(SelectorError::new(at, Problem::ExpectedString)),
        }
    }

    fn set(&mut self) -> Result<Vec<String>, SelectorError> {
        let at = self.offset();
        if self.next() != Tok::LBrace {
            return Err(SelectorError::new(at, Problem::ExpectedSet));
        }
        let mut values = Vec::new();
        while let Tok::Str(s) = self.peek() {
            values.push(s.clone());
            self.next();
            if *self.peek() == Tok::Comma {
                self.next();
            } else {
                break;
            }
        }
        let at = self.offset();
        if self.next() != Tok::RBrace {
            return Err(SelectorError::new(at, Problem::ExpectedRBrace));
        }
        Ok(values)
    }

    fn op(&mut self, depth: usize) -> Result<Expr, SelectorError> {
        if depth > MAX_DEPTH {
            return Err(SelectorError::new(self.offset(), Problem::TooDeep));
        }
        let mut negated = false;
        while *self.peek() == Tok::Not {
            negated = !negated;
            self.next();
        }
        let at = self.offset();
        let expr = match self.next() {
            Tok::Has(l) => Expr::Has(l),
            Tok::All => Expr::All,
            Tok::Global => Expr::Global,
            Tok::Label(l) => {
                let at = self.offset();
                match self.next() {
                    Tok::Eq => Expr::Eq(l, self.string()?),
                    Tok::Ne => Expr::Ne(l, self.string()?),
                    Tok::Contains => Expr::Contains(l, self.string()?),
                    Tok::StartsWith => Expr::StartsWith(l, self.string()?),
                    Tok::EndsWith => Expr::EndsWith(l, self.string()?),
                    Tok::In => Expr::In(l, self.set()?),
                    Tok::NotIn => Expr::NotIn(l, self.set()?),
                    Tok::Eof => return Err(SelectorError::new(at, Problem::UnexpectedEnd)),
                    _ => return Err(SelectorError::new(at, Problem::ExpectedOperator(l))),
                }
            }
            Tok::LParen => {
                let e = self.or(depth + 1)?;
                let at = self.offset();
                if self.next() != Tok::RParen {
                    return Err(SelectorError::new(at, Problem::ExpectedRParen));
                }
                e
            }
            Tok::Eof => return Err(SelectorError::new(at, Problem::UnexpectedEnd)),
            t => {
                return Err(SelectorError::new(
                    at,
                    Problem::UnexpectedToken(t.describe()),
                ));
            }
        };
        let expr = normalize(expr);
        Ok(if negated {
            normalize(Expr::Not(Box::new(expr)))
        } else {
            expr
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect()
    }

    fn m(sel: &str, pairs: &[(&str, &str)]) -> bool {
        Selector::parse(sel)
            .unwrap_or_else(|e| panic!("{sel}: {e}"))
            .matches(&labels(pairs))
    }

    #[test]
    fn every_operator_means_what_calico_says() {
        let l = &[("app", "web"), ("tier", "front-end"), ("env", "prod")];
        assert!(m("app == 'web'", l));
        assert!(!m("app == \"db\"", l));
        assert!(m("app != 'db'", l));
        assert!(
            m("missing != 'x'", l),
            "!= is true when the label is absent"
        );
        assert!(m("app in {'a', 'web'}", l));
        assert!(!m("app in {}", l));
        assert!(m("app not in {'a'}", l));
        assert!(m("missing not in {'a'}", l), "not in is true when absent");
        assert!(!m("missing in {'a'}", l));
        assert!(m("has(app)", l));
        assert!(m("!has(missing)", l));
        assert!(m("tier contains 'nt-e'", l));
        assert!(m("tier starts with 'front'", l));
        assert!(m("tier ends with 'end'", l));
        assert!(m("all()", l));
        assert!(m("", l));
        assert!(m("  ", l));
    }

    #[test]
    fn not_binds_tighter_than_and_which_binds_tighter_than_or() {
        let l = &[("a", "1")];
        // !has(a) && has(b) || has(a)  ==  ((!has(a)) && has(b)) || has(a)
        assert!(m("!has(a) && has(b) || has(a)", l));
        assert!(!m("!(has(a) && has(b) || has(a))", l));
        assert!(m("has(b) || has(a) && a == '1'", l));
        assert!(!m("(has(b) || has(a)) && a == '2'", l));
        assert!(m("!!has(a)", l));
        assert!(!m("!!!has(a)", l));
    }

    #[test]
    fn labels_take_calico_characters_and_operators_need_word_boundaries() {
        assert!(m("k8s.io/app-name_x == 'v'", &[("k8s.io/app-name_x", "v")]));
        assert!(m("a notin {'x'}", &[("a", "y")]));
        assert!(m("a not   in {'x'}", &[("a", "y")]));
        // "inx" is not the operator "in".
        assert!(Selector::parse("a inx {'x'}").is_err());
        // A value may hold the other quote and anything else.
        assert!(m("a == 'say \"hi\" && (x)'", &[("a", "say \"hi\" && (x)")]));
    }

    #[test]
    fn malformed_selectors_say_what_and_where() {
        let cases: &[(&str, Problem)] = &[
            ("a == 'x", Problem::UnterminatedString),
            ("a = 'x'", Problem::Expected("==")),
            ("a == 'x' & b", Problem::Expected("&&")),
            ("a 'x'", Problem::ExpectedOperator("a".into())),
            ("a == b", Problem::ExpectedString),
            ("a in 'x'", Problem::ExpectedSet),
            ("a in {'x'", Problem::ExpectedRBrace),
            ("(a == 'x'", Problem::ExpectedRParen),
            ("has(a", Problem::UnclosedCall("has(")),
            ("a == 'x' b == 'y'", Problem::TrailingInput),
            ("a == 'x' &&", Problem::UnexpectedEnd),
            ("#", Problem::UnexpectedChar('#')),
            ("&& a", Problem::UnexpectedToken("'&&'")),
            ("|| has(a)", Problem::UnexpectedToken("'||'")),
        ];
        for (sel, problem) in cases {
            let err = Selector::parse(sel).expect_err(sel);
            assert_eq!(&err.problem, problem, "{sel}");
        }
        let err = Selector::parse("app == 'x' && b").unwrap_err();
        assert_eq!(err.offset, 15, "{err}");
    }

    #[test]
    fn deep_nesting_is_refused_not_overflowed() {
        let deep = format!("{}has(a){}", "(".repeat(1_000), ")".repeat(1_000));
        assert_eq!(
            Selector::parse(&deep).unwrap_err().problem,
            Problem::TooDeep
        );
        let nots = format!("{}has(a)", "!".repeat(10_001));
        assert!(
            Selector::parse(&nots).is_ok(),
            "leading ! collapse, no recursion"
        );
        let long = "a".repeat(MAX_SELECTOR_LEN + 1);
        assert_eq!(
            Selector::parse(&long).unwrap_err().problem,
            Problem::TooLong
        );
    }

    #[test]
    fn equal_meaning_prints_and_compares_equal() {
        let a = Selector::parse("(b in {'y', 'x', 'y'}) && (has(a) && c == 'z')").unwrap();
        let b = Selector::parse("b in {\"x\",\"y\"} && has(a) && c == \"z\"").unwrap();
        assert_eq!(a, b);
        assert_eq!(a.to_string(), "b in {\"x\", \"y\"} && has(a) && c == \"z\"");
        let c = Selector::parse("!(a == 'x' || b == 'y') && (c == 'z' || d == 'w')").unwrap();
        assert_eq!(Selector::parse(&c.to_string()).unwrap(), c);
        assert_eq!(
            c.to_string(),
            "!(a == \"x\" || b == \"y\") && (c == \"z\" || d == \"w\")"
        );
        assert_eq!(
            Selector::parse("all()").unwrap(),
            Selector::parse("").unwrap()
        );
    }

    #[test]
    fn namespace_selectors_tell_namespaced_from_global_entities() {
        let ns = labels(&[("team", "a")]);
        let all = Selector::parse("all()").unwrap();
        let global = Selector::parse("global()").unwrap();
        let not_has = Selector::parse("!has(team)").unwrap();
        assert!(all.matches_namespace(Some(&ns)));
        assert!(!all.matches_namespace(None));
        assert!(!global.matches_namespace(Some(&ns)));
        assert!(global.matches_namespace(None));
        // Calico's label rewrite makes a negated namespace selector true
        // for global entities (they carry no namespace labels at all).
        assert!(not_has.matches_namespace(None));
        assert!(!not_has.matches_namespace(Some(&ns)));
        assert!(global.uses_global() && !all.uses_global());
    }

    #[test]
    fn and_of_selectors_drops_all() {
        let a = Selector::parse("has(a)").unwrap();
        assert_eq!(Selector::all().and(&a), a);
        assert_eq!(a.and(&Selector::all()), a);
        let b = Selector::parse("has(b)").unwrap();
        assert_eq!(a.and(&b), Selector::parse("has(a) && has(b)").unwrap());
    }

    #[test]
    fn layered_labels_prefer_the_first_map() {
        let own = labels(&[("a", "1")]);
        let implicit = labels(&[("a", "2"), ("b", "3")]);
        let l = Layered(&own, &implicit);
        assert_eq!(l.get("a"), Some("1"));
        assert_eq!(l.get("b"), Some("3"));
        assert_eq!(l.get("c"), None);
    }
}
