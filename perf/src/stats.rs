//! What the sink counts: frames and bytes of the trial, reordering, and the
//! one-way latency in an HdrHistogram. Sans-IO: the caller passes the time.

use hdrhistogram::Histogram;
use serde::Serialize;

/// Highest latency the histogram holds (60 s); longer ones are clamped.
const MAX_LATENCY_NS: u64 = 60_000_000_000;

/// Several generator threads (one per worker core) each number their
/// frames from `stream << STREAM_SHIFT`, so no two frames of a trial share
/// a number.
pub const STREAM_SHIFT: u32 = 48;

/// Counters of one trial at the sink.
#[derive(Clone, Debug)]
pub struct SeqCounter {
    /// Frames of the trial received.
    pub received: u64,
    /// Bytes of those frames (without FCS).
    pub bytes: u64,
    /// Frames whose sequence number was below one already seen in the
    /// same flow (RFC 4737: order matters within a flow; frames of two
    /// flows on two cores have none between them).
    pub reordered: u64,
    /// Highest sequence number seen, per flow.
    pub highest: Vec<Option<u64>>,
    /// One-way latency, nanoseconds.
    pub latency: Histogram<u64>,
}

impl Default for SeqCounter {
    fn default() -> Self {
        SeqCounter::new()
    }
}

impl SeqCounter {
    /// Empty counters for one flow.
    pub fn new() -> SeqCounter {
        SeqCounter::with_flows(1)
    }

    /// Empty counters for `flows` flows; the histogram and the per-flow
    /// marks are allocated here, never per frame.
    pub fn with_flows(flows: usize) -> SeqCounter {
        SeqCounter {
            received: 0,
            bytes: 0,
            reordered: 0,
            highest: vec![None; flows.max(1)],
            latency: Histogram::new_with_bounds(1, MAX_LATENCY_NS, 3)
                .expect("static histogram bounds are valid"),
        }
    }

    /// Counts one frame of `len` bytes with sequence `seq`, sent at
    /// `sent_ns` and seen at `now_ns` (same clock).
    #[inline]
    pub fn record(&mut self, seq: u64, len: usize, sent_ns: u64, now_ns: u64) {
        self.record_in_flow(seq, 0, len, sent_ns, now_ns);
    }

    /// The same for a frame of flow `flow` (flows beyond those counted
    /// share the last mark).
    #[inline]
    pub fn record_in_flow(&mut self, seq: u64, flow: usize, len: usize, sent_ns: u64, now_ns: u64) {
        self.received += 1;
        self.bytes += len as u64;
        let last = self.highest.len() - 1;
        let mark = &mut self.highest[flow.min(last)];
        match *mark {
            Some(h) if seq < h => self.reordered += 1,
            _ => *mark = Some(seq),
        }
        // A zero latency is possible only if the two clock reads collide;
        // record it as the histogram's smallest value.
        let lat = now_ns.saturating_sub(sent_ns).clamp(1, MAX_LATENCY_NS);
        self.latency.saturating_record(lat);
    }

    /// Frames lost out of `sent`.
    pub fn lost(&self, sent: u64) -> u64 {
        sent.saturating_sub(self.received)
    }

    /// The latency figures, `None` when nothing arrived.
    pub fn latency_summary(&self) -> Option<LatencySummary> {
        LatencySummary::from_histogram(&self.latency)
    }
}

/// Latency percentiles in nanoseconds and a CDF for the plot.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct LatencySummary {
    /// Frames in the histogram.
    pub count: u64,
    /// Smallest.
    pub min_ns: u64,
    /// Median.
    pub p50_ns: u64,
    /// 90th percentile.
    pub p90_ns: u64,
    /// 99th percentile.
    pub p99_ns: u64,
    /// 99.9th percentile.
    pub p999_ns: u64,
    /// Largest.
    pub max_ns: u64,
    /// Mean.
    pub mean_ns: f64,
    /// (percentile 0..=100, latency ns) points, for the CDF plot.
    pub cdf: Vec<(f64, u64)>,
}

impl LatencySummary {
    /// Summarises a histogram; `None` when empty.
    pub fn from_histogram(h: &Histogram<u64>) -> Option<LatencySummary> {
        if h.is_empty() {
            return None;
        }
        let mut cdf: Vec<(f64, u64)> = (0..=100)
            .map(|i| {
                let q = f64::from(i) / 100.0;
                (q * 100.0, h.value_at_quantile(q))
            })
            .collect();
        for q in [0.995, 0.999, 0.9999] {
            cdf.push((q * 100.0, h.value_at_quantile(q)));
        }
        cdf.sort_by(|a, b| a.0.total_cmp(&b.0));
        Some(LatencySummary {
            count: h.len(),
            min_ns: h.min(),
            p50_ns: h.value_at_quantile(0.5),
            p90_ns: h.value_at_quantile(0.9),
            p99_ns: h.value_at_quantile(0.99),
            p999_ns: h.value_at_quantile(0.999),
            max_ns: h.max(),
            mean_ns: h.mean(),
            cdf,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn in_order_frames_count_no_reordering_and_loss_is_the_difference() {
        let mut c = SeqCounter::new();
        for seq in [0u64, 1, 2, 4, 7] {
            c.record(seq, 60, 1_000, 1_000 + 10_000 * (seq + 1));
        }
        assert_eq!(c.received, 5);
        assert_eq!(c.bytes, 300);
        assert_eq!(c.reordered, 0);
        assert_eq!(c.highest[0], Some(7));
        assert_eq!(c.lost(8), 3);
        assert_eq!(c.lost(2), 0, "never negative");
    }

    #[test]
    fn a_late_frame_counts_as_reordered_once_and_does_not_lower_the_high_mark() {
        let mut c = SeqCounter::new();
        for seq in [0u64, 2, 1, 3, 5, 4] {
            c.record(seq, 60, 0, 100);
        }
        assert_eq!(c.reordered, 2);
        assert_eq!(c.highest[0], Some(5));
        assert_eq!(c.received, 6);
    }

    #[test]
    fn order_counts_within_a_flow_not_between_flows() {
        let mut c = SeqCounter::with_flows(2);
        let b = 1u64 << STREAM_SHIFT;
        // Flow 0 on one core, flow 1 (another generator's stream) on the
        // other: they interleave freely; only 6 after 7 in flow 1 counts.
        for (seq, flow) in [
            (b, 1),
            (0, 0),
            (b + 5, 1),
            (3, 0),
            (4, 0),
            (b + 7, 1),
            (b + 6, 1),
        ] {
            c.record_in_flow(seq, flow, 60, 0, 100);
        }
        assert_eq!(c.reordered, 1);
        assert_eq!(c.highest, vec![Some(4), Some(b + 7)]);
        // A flow beyond those counted shares the last mark, never panics.
        c.record_in_flow(1, 9, 60, 0, 100);
        assert_eq!(c.reordered, 2);
    }

    #[test]
    fn latency_percentiles_are_ordered_and_within_histogram_precision() {
        let mut c = SeqCounter::new();
        for i in 1..=1000u64 {
            c.record(i, 60, 5_000, 5_000 + i * 1_000);
        }
        let s = c.latency_summary().unwrap();
        assert_eq!(s.count, 1000);
        assert!(s.min_ns > 0);
        assert!(s.min_ns <= s.p50_ns && s.p50_ns <= s.p99_ns && s.p99_ns <= s.max_ns);
        let close = |v: u64, want: u64| (v as f64 - want as f64).abs() / (want as f64) < 0.01;
        assert!(close(s.p50_ns, 500_000), "p50 {}", s.p50_ns);
        assert!(close(s.p99_ns, 990_000), "p99 {}", s.p99_ns);
        assert!(close(s.max_ns, 1_000_000), "max {}", s.max_ns);
        assert!(
            s.cdf
                .windows(2)
                .all(|w| w[0].0 <= w[1].0 && w[0].1 <= w[1].1)
        );
    }

    #[test]
    fn a_clock_going_backwards_records_the_smallest_latency_not_a_panic() {
        let mut c = SeqCounter::new();
        c.record(0, 60, 10_000, 5_000);
        assert_eq!(c.latency_summary().unwrap().min_ns, 1);
        assert!(SeqCounter::new().latency_summary().is_none());
    }
}
