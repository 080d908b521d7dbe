//! A forwarding worker: one arena, its ports, one pipeline, one loop.
//!
//! [`Worker::poll_once`] is one iteration: for each port, `rx_burst` ->
//! pipeline -> `tx_burst` on every port that got frames -> free what a full
//! TX ring refused; then every port's `poll(now)` (completions, refill,
//! wake-ups). Pinning to a core, adaptive polling (back off when idle) and the
//! control channel that changes ports and neighbours belong to the daemon
//! issue; they wrap this loop without changing it.

use std::time::Instant;

use crate::counters::{Counters, DropReason};
use crate::endpoint::{Endpoint, PortTable};
use crate::fib::FibReader;
use crate::frame::{FrameArena, FrameDesc, Port, PortId};
use crate::pipeline::{BURST, Pipeline, PipelineConfig, TxBatches};

/// One poll-mode worker.
pub struct Worker {
    arena: FrameArena,
    ports: Vec<Box<dyn Port>>,
    pipeline: Pipeline,
    rx: [FrameDesc; BURST],
    tx: TxBatches,
}

impl Worker {
    /// A worker with no ports yet.
    pub fn new(arena: FrameArena, cfg: PipelineConfig, fib: FibReader) -> Self {
        Worker {
            arena,
            ports: Vec::new(),
            pipeline: Pipeline::new(cfg, PortTable::default(), fib),
            rx: [FrameDesc::default(); BURST],
            tx: TxBatches::new(0),
        }
    }

    /// Adds `port`, described by `endpoint`; returns its id (the id FIB
    /// routes to it use).
    pub fn add_port(&mut self, port: Box<dyn Port>, endpoint: Endpoint) -> PortId {
        let id = self.pipeline.ports_mut().push(endpoint);
        debug_assert_eq!(id as usize, self.ports.len());
        self.ports.push(port);
        self.tx.add_port();
        id
    }

    /// The arena (for its free count, or the UMEM to bind sockets to).
    pub fn arena(&self) -> &FrameArena {
        &self.arena
    }

    /// The pipeline (port table, neighbours, counters).
    pub fn pipeline(&self) -> &Pipeline {
        &self.pipeline
    }

    /// The pipeline, writable.
    pub fn pipeline_mut(&mut self) -> &mut Pipeline {
        &mut self.pipeline
    }

    /// A snapshot of the counters.
    pub fn counters(&self) -> Counters {
        *self.pipeline.counters()
    }

    /// The port `id`.
    pub fn port(&self, id: PortId) -> Option<&dyn Port> {
        self.ports.get(id as usize).map(|p| &**p)
    }

    /// One loop iteration at `now`; returns how many frames were received.
    pub fn poll_once(&mut self, now: Instant) -> usize {
        let mut received = 0;
        for ingress in 0..self.ports.len() {
            let n = self.ports[ingress].rx_burst(&mut self.arena, &mut self.rx);
            if n == 0 {
                continue;
            }
            received += n;
            self.pipeline.process(
                &mut self.arena,
                ingress as PortId,
                &self.rx[..n],
                &mut self.tx,
                now,
            );
            self.flush();
        }
        for port in &mut self.ports {
            port.poll(&mut self.arena, now);
        }
        received
    }

    /// Transmits every non-empty TX batch; frees and counts what the ports
    /// refuse.
    fn flush(&mut self) {
        for (id, port) in self.ports.iter_mut().enumerate() {
            let Some(batch) = self.tx.batch_mut(id as PortId) else {
                continue;
            };
            if batch.is_empty() {
                continue;
            }
            let taken = port.tx_burst(&mut self.arena, batch);
            let counters = self.pipeline.counters_mut();
            counters.tx_packets += taken as u64;
            counters.tx_bytes += batch[..taken].iter().map(|d| u64::from(d.len)).sum::<u64>();
            for d in &batch[taken..] {
                self.arena.free(d.addr);
                counters.drop(DropReason::TxRingFull);
            }
            batch.clear();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_worker_can_move_to_its_own_thread() {
        fn assert_send<T: Send>() {}
        assert_send::<Worker>();
    }
}
