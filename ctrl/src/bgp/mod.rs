//! The BGP speaker: codec ([`packet`]), session state machine ([`fsm`]),
//! routing tables ([`rib`]), the Sans-IO core that owns the FSMs and the
//! RIB (`core`), the tokio tasks that run it ([`speaker`]) and the
//! recording and replay of its inputs ([`record`]). Imports go one way:
//! speaker and record use core, which uses fsm, rib and packet.

pub mod config;
mod core;
pub mod fsm;
pub mod packet;
pub mod record;
pub mod rib;
pub mod speaker;

mod md5;
