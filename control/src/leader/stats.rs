//! What the leader's loops and the services measure, for the HTTP port's `/metrics`: the
//! scheduler's cycles, the submits this replica answered, and how fast started jobs reach
//! their agents.

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::registry::{Registry, Unit};

/// Counters and histograms, shared by the loops that observe them and the registry that
/// encodes them (each is a handle to the same numbers).
#[derive(Clone, Debug)]
pub struct Stats {
    /// How long each scheduling cycle took (the plan, not proposing it).
    pub cycle_seconds: Histogram,
    /// How many pending jobs each cycle considered.
    pub cycle_pending: Histogram,
    /// Starts the scheduler planned, and starts apply dropped (the state had moved on).
    pub planned_starts: Counter,
    pub dropped_starts: Counter,
    /// Planned starts ahead of a job that waits (backfill's).
    pub backfill_starts: Counter,
    /// Running jobs told to stop to make room for another (preemption).
    pub preempted: Counter,
    /// From a job's allocation (its start in the state) to its launch sent to each node's agent.
    pub dispatch_seconds: Histogram,
    /// From a submit's arrival here to its answer (forwarded or committed here).
    pub submit_seconds: Histogram,
    /// How long each forecast of every pending job's start took (off the cycle).
    pub forecast_seconds: Histogram,
}

impl Default for Stats {
    fn default() -> Stats {
        Stats {
            // 0.1 ms to about 26 s.
            cycle_seconds: Histogram::new(exponential_buckets(0.0001, 2.0, 19)),
            // 1 to about a million jobs.
            cycle_pending: Histogram::new(exponential_buckets(1.0, 4.0, 11)),
            planned_starts: Counter::default(),
            dropped_starts: Counter::default(),
            backfill_starts: Counter::default(),
            preempted: Counter::default(),
            // 1 ms to about 65 s.
            dispatch_seconds: Histogram::new(exponential_buckets(0.001, 2.0, 17)),
            // 0.1 ms to about 6.5 s.
            submit_seconds: Histogram::new(exponential_buckets(0.0001, 2.0, 17)),
            // 0.1 ms to about 26 s.
            forecast_seconds: Histogram::new(exponential_buckets(0.0001, 2.0, 19)),
        }
    }
}

impl Stats {
    pub fn register(&self, registry: &mut Registry) {
        registry.register_with_unit(
            "scheduler_cycle",
            "How long each scheduling cycle took to plan",
            Unit::Seconds,
            self.cycle_seconds.clone(),
        );
        registry.register(
            "scheduler_cycle_pending_jobs",
            "How many pending jobs each scheduling cycle considered (its depth)",
            self.cycle_pending.clone(),
        );
        registry.register("scheduler_planned_starts", "Job starts the scheduler planned", self.planned_starts.clone());
        registry.register(
            "scheduler_dropped_starts",
            "Planned starts dropped when applied, the state having moved on",
            self.dropped_starts.clone(),
        );
        registry.register(
            "scheduler_backfill_starts",
            "Planned starts ahead of a job of their partition that waits (backfill)",
            self.backfill_starts.clone(),
        );
        registry.register(
            "scheduler_preempted_jobs",
            "Running jobs the scheduler preempted to make room for another",
            self.preempted.clone(),
        );
        registry.register_with_unit(
            "dispatch",
            "From a job's allocation to its launch sent to a node's agent",
            Unit::Seconds,
            self.dispatch_seconds.clone(),
        );
        registry.register_with_unit(
            "submit",
            "From a submit's arrival at this replica to its answer",
            Unit::Seconds,
            self.submit_seconds.clone(),
        );
        registry.register_with_unit(
            "scheduler_forecast",
            "How long each forecast of every pending job's start took (off the scheduling cycle)",
            Unit::Seconds,
            self.forecast_seconds.clone(),
        );
    }
}
