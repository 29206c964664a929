//! What the leader's loops and the services measure, for the HTTP port's `/metrics`: the
//! scheduler's cycles, the submits this replica answered, and how fast started jobs reach
//! their agents.

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
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
    /// How far the start a job was shown while it waited was from its start, for the first
    /// one shown (`shown="first"`) and the one in force when it started (`shown="last"`).
    pub start_error_seconds: Family<Vec<(&'static str, &'static str)>, Histogram>,
}

/// Which start shown a job is judged by in `scheduler_start_error_seconds`.
#[derive(Clone, Copy, Debug)]
pub enum Shown {
    First,
    Last,
}

impl Stats {
    /// Observes how far a start shown was from the start, in seconds.
    pub fn start_error(&self, shown: Shown, error_s: u64) {
        let label = match shown {
            Shown::First => "first",
            Shown::Last => "last",
        };
        self.start_error_seconds.get_or_create(&vec![("shown", label)]).observe(error_s as f64);
    }
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
            // 1 s to about 12 days.
            start_error_seconds: Family::new_with_constructor(|| Histogram::new(exponential_buckets(1.0, 2.0, 21))),
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
        registry.register_with_unit(
            "scheduler_start_error",
            "How far the start a job was shown while it waited (squeue --start) was from its start, for jobs that \
             waited a minute or more: the first shown, and the one in force when it started",
            Unit::Seconds,
            self.start_error_seconds.clone(),
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn start_errors_are_one_histogram_by_which_start_was_shown() {
        let stats = Stats::default();
        stats.start_error(Shown::First, 90);
        stats.start_error(Shown::First, 3_000);
        stats.start_error(Shown::Last, 0);
        let mut registry = Registry::with_prefix("quorum");
        stats.register(&mut registry);
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &registry).unwrap();
        assert!(text.contains("quorum_scheduler_start_error_seconds_count{shown=\"first\"} 2"), "{text}");
        assert!(text.contains("quorum_scheduler_start_error_seconds_sum{shown=\"first\"} 3090.0"), "{text}");
        assert!(text.contains("quorum_scheduler_start_error_seconds_count{shown=\"last\"} 1"), "{text}");
    }
}
