//! The watcher's resync semantics as a pure state machine: a reflector
//! store that turns the watcher's `Init`, `InitApply`, `InitDone`, `Apply`
//! and `Delete` into net changes.
//!
//! A (re)list is buffered from `Init` to `InitDone` and then compared with
//! what the store held: objects that are new or changed come out as
//! [`Change::Apply`], objects the list no longer has as [`Change::Delete`],
//! then [`Change::Synced`]. Until `InitDone` the previous contents stay in
//! force, so a relist after `410 Gone` never makes the world look empty for
//! a moment (a pod that still exists is never seen to vanish). Outside a
//! list, an `Apply` that changes nothing and a `Delete` of an unknown
//! object produce nothing.

use std::collections::BTreeMap;

/// One input: a watcher event reduced to key and value.
#[derive(Debug, Clone, PartialEq)]
pub enum Input<K, V> {
    /// A (re)list starts.
    Init,
    /// An object of the list.
    InitApply(K, V),
    /// The list is complete.
    InitDone,
    /// An object was added or modified (`ADDED`, `MODIFIED`).
    Apply(K, V),
    /// An object was deleted (`DELETED`).
    Delete(K),
}

/// One net change.
#[derive(Debug, Clone, PartialEq)]
pub enum Change<K, V> {
    /// An object is new or different.
    Apply(V),
    /// An object is gone.
    Delete(K),
    /// A full list was taken: the store is the API's state.
    Synced,
}

/// The store: what the API holds, as last listed and watched.
#[derive(Debug, Clone)]
pub struct Store<K, V> {
    objects: BTreeMap<K, V>,
    listing: Option<BTreeMap<K, V>>,
    synced: bool,
}

impl<K, V> Default for Store<K, V> {
    fn default() -> Self {
        Store {
            objects: BTreeMap::new(),
            listing: None,
            synced: false,
        }
    }
}

impl<K: Ord + Clone, V: PartialEq + Clone> Store<K, V> {
    /// An empty store, not synced.
    pub fn new() -> Self {
        Self::default()
    }

    /// A full list has completed at least once.
    pub fn synced(&self) -> bool {
        self.synced
    }

    /// The objects in force.
    pub fn objects(&self) -> &BTreeMap<K, V> {
        &self.objects
    }

    /// Takes one input; the net changes are appended to `out`.
    pub fn handle(&mut self, input: Input<K, V>, out: &mut Vec<Change<K, V>>) {
        match input {
            Input::Init => self.listing = Some(BTreeMap::new()),
            Input::InitApply(k, v) => {
                // An `InitApply` without `Init` (not sent by the watcher)
                // starts a list all the same.
                self.listing.get_or_insert_with(BTreeMap::new).insert(k, v);
            }
            Input::InitDone => {
                let listed = self.listing.take().unwrap_or_default();
                for k in self.objects.keys() {
                    if !listed.contains_key(k) {
                        out.push(Change::Delete(k.clone()));
                    }
                }
                for (k, v) in &listed {
                    if self.objects.get(k) != Some(v) {
                        out.push(Change::Apply(v.clone()));
                    }
                }
                self.objects = listed;
                self.synced = true;
                out.push(Change::Synced);
            }
            Input::Apply(k, v) => {
                if let Some(listing) = &mut self.listing {
                    listing.insert(k.clone(), v.clone());
                }
                if self.objects.get(&k) != Some(&v) {
                    self.objects.insert(k, v.clone());
                    out.push(Change::Apply(v));
                }
            }
            Input::Delete(k) => {
                if let Some(listing) = &mut self.listing {
                    listing.remove(&k);
                }
                if self.objects.remove(&k).is_some() {
                    out.push(Change::Delete(k));
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(
        store: &mut Store<&'static str, u32>,
        inputs: Vec<Input<&'static str, u32>>,
    ) -> Vec<Change<&'static str, u32>> {
        let mut out = Vec::new();
        for i in inputs {
            store.handle(i, &mut out);
        }
        out
    }

    #[test]
    fn first_list_applies_everything_at_init_done_then_syncs() {
        let mut s = Store::new();
        let out = run(
            &mut s,
            vec![
                Input::Init,
                Input::InitApply("a", 1),
                Input::InitApply("b", 2),
            ],
        );
        assert!(out.is_empty(), "nothing before InitDone: {out:?}");
        assert!(!s.synced());
        let out = run(&mut s, vec![Input::InitDone]);
        assert_eq!(out, [Change::Apply(1), Change::Apply(2), Change::Synced]);
        assert!(s.synced());
    }

    #[test]
    fn relist_keeps_the_old_state_until_done_then_deletes_what_is_gone() {
        let mut s = Store::new();
        run(
            &mut s,
            vec![
                Input::Init,
                Input::InitApply("a", 1),
                Input::InitApply("b", 2),
                Input::InitDone,
            ],
        );
        let out = run(&mut s, vec![Input::Init, Input::InitApply("a", 1)]);
        assert!(out.is_empty());
        assert_eq!(s.objects().len(), 2, "b still in force during the relist");
        let out = run(&mut s, vec![Input::InitApply("c", 3), Input::InitDone]);
        assert_eq!(out, [Change::Delete("b"), Change::Apply(3), Change::Synced]);
    }

    #[test]
    fn unchanged_apply_and_unknown_delete_produce_nothing() {
        let mut s = Store::new();
        run(
            &mut s,
            vec![Input::Init, Input::InitApply("a", 1), Input::InitDone],
        );
        assert!(run(&mut s, vec![Input::Apply("a", 1), Input::Delete("zz")]).is_empty());
        assert_eq!(
            run(&mut s, vec![Input::Apply("a", 5), Input::Delete("a")]),
            [Change::Apply(5), Change::Delete("a")]
        );
    }
}
