//! The BGP speaker: codec ([`packet`]), session state machine ([`fsm`]),
//! routing tables ([`rib`]) and the tokio tasks that run them ([`speaker`]).

pub mod fsm;
pub mod packet;
pub mod record;
pub mod rib;
pub mod speaker;

mod md5;
