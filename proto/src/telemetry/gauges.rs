//! Gauges computed at each scrape (a prometheus-client `Collector` writes them): one metric
//! name, one value per label set. The controllers' and the agents' `/metrics` use them.

use std::collections::BTreeMap;
use std::fmt;

use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::metrics::MetricType;

/// A metric's label values, in the order of its label names.
pub type Labels = Vec<(&'static str, String)>;

/// Gauges of one name, one per label set.
pub struct Gauges {
    name: &'static str,
    help: &'static str,
    values: BTreeMap<Labels, i64>,
}

impl Gauges {
    pub fn new(name: &'static str, help: &'static str) -> Gauges {
        Gauges { name, help, values: BTreeMap::new() }
    }

    pub fn add(&mut self, labels: Labels, by: i64) {
        *self.values.entry(labels).or_default() += by;
    }

    pub fn set(&mut self, labels: Labels, to: i64) {
        self.values.insert(labels, to);
    }

    pub fn encode(&self, encoder: &mut DescriptorEncoder) -> fmt::Result {
        let mut family = encoder.encode_descriptor(self.name, self.help, None, MetricType::Gauge)?;
        // A gauge without labels is written as one (`quorum_cpus 16`, not `quorum_cpus{} 16`).
        if let Some(value) = self.values.get(&Vec::new()).filter(|_| self.values.len() == 1) {
            return ConstGauge::new(*value).encode(family);
        }
        for (labels, value) in &self.values {
            ConstGauge::new(*value).encode(family.encode_family(labels)?)?;
        }
        Ok(())
    }
}

pub fn labels<const N: usize>(pairs: [(&'static str, &str); N]) -> Labels {
    pairs.into_iter().map(|(k, v)| (k, v.to_string())).collect()
}
