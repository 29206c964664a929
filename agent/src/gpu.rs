//! GPU health, checked for every heartbeat: temperature, ECC errors (uncorrectable → FAILURE,
//! correctable above a threshold → WARNING), XID errors, retired pages and PCIe replays. Two
//! sources: NVML, loaded at run time (the agent builds and runs where there is no GPU and no
//! driver), and a simulated one for `--gpus sim:...` whose faults are injected at run time
//! (`quorum admin gpu-fault`).

use quorum_model::gpu_fault::Fault;
use quorum_proto::agent::{GpuHealth, GpuState};

use crate::resources::SimGpu;

/// Correctable ECC errors (volatile count) from which a GPU is in WARNING.
pub const ECC_CORRECTABLE_WARNING: u64 = 1000;
/// Retired pages from which a GPU is in FAILURE (64 is where NVIDIA recommends a replacement).
pub const RETIRED_PAGES_FAILURE: u64 = 64;
/// Degrees C from which a GPU is in WARNING and in FAILURE.
pub const TEMPERATURE_WARNING: u32 = 87;
pub const TEMPERATURE_FAILURE: u32 = 95;
/// PCIe replays between two checks from which a GPU is in WARNING.
pub const PCIE_REPLAY_WARNING: u64 = 100;

/// XIDs that mean the GPU or its memory needs a reset or a replacement (NVIDIA's XID catalogue:
/// double-bit ECC, fallen off the bus, row remapping failures, NVLink, contained and
/// uncontained ECC, GSP errors). Other XIDs (application faults such as 13, 31, 43) only warn.
const CRITICAL_XIDS: &[u64] = &[48, 61, 62, 63, 64, 74, 79, 92, 94, 95, 119, 120, 140];

fn xid_meaning(xid: u64) -> &'static str {
    match xid {
        13 => "graphics engine exception",
        31 => "GPU memory page fault",
        43 => "GPU stopped processing",
        48 => "double-bit ECC error",
        61 | 62 => "internal micro-controller error",
        63 | 64 => "ECC page retirement or row remapping failure",
        74 => "NVLink error",
        79 => "GPU has fallen off the bus",
        92 => "high single-bit ECC error rate",
        94 => "contained ECC error",
        95 => "uncontained ECC error",
        119 | 120 => "GSP error",
        140 => "unrecovered ECC error",
        _ => "see NVIDIA's XID catalogue",
    }
}

/// What one check read from one GPU.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Reading {
    pub temperature_c: u32,
    pub ecc_uncorrectable: u64,
    pub ecc_correctable: u64,
    /// XID errors seen since the GPU was last healthy (kept until the fault is cleared: a GPU
    /// that raised a critical XID needs a reset).
    pub xids: Vec<u64>,
    pub retired_pages: u64,
    /// PCIe replays since the previous check.
    pub pcie_replays: u64,
    /// Row remapping (A100, H100 and later, instead of page retirement): rows remapped for
    /// uncorrectable errors, a remapping waiting for a GPU reset, a remapping that failed.
    pub remapped_rows: u64,
    pub remap_pending: bool,
    pub remap_failed: bool,
    /// How busy it is (percent), the memory in use (MiB), and the energy it has drawn since
    /// the driver loaded (mJ): what jobs are told they used; `None` where the GPU does not say.
    pub utilization_pct: Option<u32>,
    pub memory_used_mb: Option<u64>,
    pub energy_mj: Option<u64>,
}

/// What a job's GPUs did on this node, sampled at every GPU check while it ran.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct GpuUse {
    pub samples: u64,
    pub util_sum: u64,
    pub mem_max_mb: u64,
    pub energy_mj: u64,
    /// The highest utilization among the job's GPUs at the last sample that read one.
    pub last_util_pct: Option<u32>,
    /// Each GPU's energy counter at its last sample, which the next one adds from.
    last_energy: Vec<(u32, u64)>,
}

impl GpuUse {
    /// Adds a check's readings of the job's `gpus`.
    pub fn sample(&mut self, readings: &[(u32, Reading)], gpus: &[u32]) {
        let mut busiest: Option<u32> = None;
        for (index, r) in readings.iter().filter(|(i, _)| gpus.contains(i)) {
            if let Some(pct) = r.utilization_pct {
                self.samples += 1;
                self.util_sum += u64::from(pct.min(100));
                busiest = Some(busiest.unwrap_or(0).max(pct.min(100)));
            }
            self.mem_max_mb = self.mem_max_mb.max(r.memory_used_mb.unwrap_or(0));
            if let Some(now) = r.energy_mj {
                match self.last_energy.iter_mut().find(|(i, _)| i == index) {
                    Some((_, last)) => {
                        self.energy_mj += now.saturating_sub(*last);
                        *last = now;
                    }
                    None => self.last_energy.push((*index, now)),
                }
            }
        }
        if busiest.is_some() {
            self.last_util_pct = busiest;
        }
    }

    /// Notes each of the job's `gpus`' energy counter as the job starts, without a sample of
    /// their use (nothing of the job's runs on them yet): the energy it draws counts from here.
    pub fn start(&mut self, readings: &[(u32, Reading)], gpus: &[u32]) {
        for (index, r) in readings.iter().filter(|(i, _)| gpus.contains(i)) {
            if let Some(now) = r.energy_mj.filter(|_| !self.last_energy.iter().any(|(i, _)| i == index)) {
                self.last_energy.push((*index, now));
            }
        }
    }

    /// As the job's record keeps it (`SAMPLES UTIL_SUM MEM_MAX_MB ENERGY_MJ` then each GPU's
    /// last energy counter as `INDEX:MJ`), for an agent restarted while the job runs.
    pub fn encode(&self) -> String {
        let mut text = format!("{} {} {} {}", self.samples, self.util_sum, self.mem_max_mb, self.energy_mj);
        for (index, mj) in &self.last_energy {
            text.push_str(&format!(" {index}:{mj}"));
        }
        text
    }

    /// What [`GpuUse::encode`] wrote; `None` when it is not that.
    pub fn decode(text: &str) -> Option<GpuUse> {
        let mut words = text.split_whitespace();
        let mut number = || words.next()?.parse::<u64>().ok();
        let (samples, util_sum, mem_max_mb, energy_mj) = (number()?, number()?, number()?, number()?);
        let last_energy = words
            .map(|w| {
                let (index, mj) = w.split_once(':')?;
                Some((index.parse().ok()?, mj.parse().ok()?))
            })
            .collect::<Option<Vec<(u32, u64)>>>()?;
        Some(GpuUse { samples, util_sum, mem_max_mb, energy_mj, last_util_pct: None, last_energy })
    }

    /// Into a job's usage report.
    pub fn add_to(&self, usage: &mut quorum_proto::api::JobUsage) {
        usage.gpu_samples += self.samples;
        usage.gpu_util_sum += self.util_sum;
        usage.gpu_mem_max_mb = usage.gpu_mem_max_mb.max(self.mem_max_mb);
        usage.gpu_energy_mj += self.energy_mj;
    }
}

/// A reading's state and what is wrong.
pub fn judge(r: &Reading) -> (GpuState, String) {
    let mut failures = Vec::new();
    let mut warnings = Vec::new();
    if r.ecc_uncorrectable > 0 {
        failures.push(format!("{} uncorrectable ECC errors", r.ecc_uncorrectable));
    }
    if r.ecc_correctable >= ECC_CORRECTABLE_WARNING {
        warnings.push(format!("{} correctable ECC errors", r.ecc_correctable));
    }
    for &xid in &r.xids {
        let text = format!("XID {xid} ({})", xid_meaning(xid));
        if CRITICAL_XIDS.contains(&xid) {
            failures.push(text);
        } else {
            warnings.push(text);
        }
    }
    if r.retired_pages >= RETIRED_PAGES_FAILURE {
        failures.push(format!("{} retired pages", r.retired_pages));
    } else if r.retired_pages > 0 {
        warnings.push(format!("{} retired pages", r.retired_pages));
    }
    if r.remap_failed {
        failures.push("row remapping failed".to_string());
    }
    if r.remap_pending {
        failures.push("row remapping pending: the GPU needs a reset".to_string());
    }
    if r.remapped_rows > 0 {
        warnings.push(format!("{} rows remapped", r.remapped_rows));
    }
    if r.temperature_c >= TEMPERATURE_FAILURE {
        failures.push(format!("temperature {} C", r.temperature_c));
    } else if r.temperature_c >= TEMPERATURE_WARNING {
        warnings.push(format!("temperature {} C", r.temperature_c));
    }
    if r.pcie_replays >= PCIE_REPLAY_WARNING {
        warnings.push(format!("{} PCIe replays", r.pcie_replays));
    }
    if !failures.is_empty() {
        failures.extend(warnings);
        (GpuState::GpuFailure, failures.join("; "))
    } else if !warnings.is_empty() {
        (GpuState::GpuWarning, warnings.join("; "))
    } else {
        (GpuState::GpuOk, String::new())
    }
}

/// Where GPU health comes from.
pub trait GpuSource: Send {
    /// One reading per GPU, by index; an error names what could not be read.
    fn read(&mut self) -> Vec<(u32, Result<Reading, String>)>;
    /// Injects a fault (simulated GPUs only).
    fn inject(&mut self, gpu: u32, fault: Fault) -> Result<(), String>;
}

/// Simulated GPUs: healthy at 40 C until a fault is injected; idle (0 %, no memory used, 60 W)
/// until a load is set (`load:PCT`: that utilization, that part of 80 GiB in use, and 60 W plus
/// 6 W a percent, whose energy adds up between reads).
pub struct SimSource {
    gpus: Vec<Reading>,
    loads: Vec<u32>,
    read_at: Option<std::time::Instant>,
}

/// What a simulated GPU holds and draws.
const SIM_MEMORY_MB: u64 = 80 * 1024;
const SIM_IDLE_W: u64 = 60;
const SIM_W_PER_PCT: u64 = 6;

fn sim_reading() -> Reading {
    Reading {
        temperature_c: 40,
        utilization_pct: Some(0),
        memory_used_mb: Some(0),
        energy_mj: Some(0),
        ..Default::default()
    }
}

impl SimSource {
    pub fn new(count: usize) -> SimSource {
        SimSource { gpus: vec![sim_reading(); count], loads: vec![0; count], read_at: None }
    }
}

impl GpuSource for SimSource {
    fn read(&mut self) -> Vec<(u32, Result<Reading, String>)> {
        let now = std::time::Instant::now();
        let ms = self.read_at.map_or(0, |t| now.duration_since(t).as_millis() as u64);
        self.read_at = Some(now);
        for (r, &load) in self.gpus.iter_mut().zip(&self.loads) {
            let watts = SIM_IDLE_W + SIM_W_PER_PCT * u64::from(load);
            r.energy_mj = Some(r.energy_mj.unwrap_or(0) + watts * ms);
            r.utilization_pct = Some(load);
            r.memory_used_mb = Some(SIM_MEMORY_MB * u64::from(load) / 100);
        }
        self.gpus.iter().enumerate().map(|(i, r)| (i as u32, Ok(r.clone()))).collect()
    }

    fn inject(&mut self, gpu: u32, fault: Fault) -> Result<(), String> {
        let count = self.gpus.len();
        let r = self
            .gpus
            .get_mut(gpu as usize)
            .ok_or_else(|| format!("there is no GPU {gpu} on this node ({count} GPUs)"))?;
        match fault {
            Fault::Xid(x) => r.xids.push(x),
            Fault::EccUncorrectable(n) => r.ecc_uncorrectable += n,
            Fault::EccCorrectable(n) => r.ecc_correctable += n,
            Fault::Temperature(c) => r.temperature_c = c,
            Fault::RetiredPages(n) => r.retired_pages += n,
            Fault::PcieReplay(n) => r.pcie_replays = n,
            Fault::RemappedRows(n) => r.remapped_rows += n,
            Fault::RemapPending => r.remap_pending = true,
            Fault::RemapFailed => r.remap_failed = true,
            Fault::Clear => *r = Reading { energy_mj: r.energy_mj, ..sim_reading() },
            Fault::Load(pct) => self.loads[gpu as usize] = pct,
        }
        Ok(())
    }
}

/// Every GPU's health, and the readings of those that could be read.
pub type Checked = (Vec<GpuHealth>, Vec<(u32, Reading)>);

/// Every GPU's health from a source (a GPU that cannot be read is in FAILURE), and the
/// readings of those that could be read.
pub fn check(source: &mut dyn GpuSource) -> Checked {
    let mut readings = Vec::new();
    let health = source
        .read()
        .into_iter()
        .map(|(index, reading)| {
            let (state, detail) = match reading {
                Ok(r) => {
                    let judged = judge(&r);
                    readings.push((index, r));
                    judged
                }
                Err(e) => (GpuState::GpuFailure, format!("cannot be read: {e}")),
            };
            GpuHealth { index, state: state as i32, detail }
        })
        .collect();
    (health, readings)
}

/// NVML, loaded at run time from the driver's libnvidia-ml.so.
pub mod nvml {
    use nvml_wrapper::bitmasks::event::EventTypes;
    use nvml_wrapper::enum_wrappers::device::{EccCounter, MemoryError, RetirementCause, TemperatureSensor};
    use nvml_wrapper::enums::event::XidError;
    use nvml_wrapper::error::NvmlError;
    use nvml_wrapper::{Device, EventSet, Nvml};

    use super::{Fault, GpuSource, Reading, SimGpu};

    pub struct NvmlSource {
        nvml: &'static Nvml,
        count: u32,
        /// Critical XID events, when the driver offers them.
        events: Option<EventSet<'static>>,
        /// XIDs seen per GPU (kept until the agent restarts: such a GPU needs a reset).
        xids: Vec<Vec<u64>>,
        replays: Vec<u64>,
    }

    /// A GPU type from an NVML name: "NVIDIA H100 80GB HBM3" → "h100".
    pub fn gpu_type(name: &str) -> String {
        let words: Vec<&str> = name.split_whitespace().filter(|w| !w.eq_ignore_ascii_case("nvidia")).collect();
        let pick = words
            .iter()
            .find(|w| {
                w.chars().any(|c| c.is_ascii_digit()) && w.chars().next().is_some_and(|c| c.is_ascii_alphabetic())
            })
            .or(words.first());
        pick.and_then(|w| w.split('-').next()).map(|w| w.to_ascii_lowercase()).unwrap_or_else(|| "gpu".into())
    }

    impl NvmlSource {
        /// Loads NVML and lists the GPUs with their device files (`/dev/nvidia<minor>`, where
        /// the driver tells the minor number); fails where there is no driver.
        #[allow(clippy::type_complexity)]
        pub fn open() -> Result<(NvmlSource, Vec<SimGpu>, Option<Vec<std::path::PathBuf>>), String> {
            let nvml = Nvml::init().map_err(|e| format!("NVML is not available: {e}"))?;
            // The agent keeps NVML for its whole life; the event set borrows it.
            let nvml: &'static Nvml = Box::leak(Box::new(nvml));
            let count = nvml.device_count().map_err(|e| format!("NVML cannot count GPUs: {e}"))?;
            let mut gpus = Vec::new();
            let mut files = Some(Vec::new());
            let mut events = nvml.create_event_set().ok();
            for index in 0..count {
                let device = nvml.device_by_index(index).map_err(|e| format!("NVML GPU {index}: {e}"))?;
                let name = device.name().unwrap_or_default();
                gpus.push(SimGpu { index, gpu_type: gpu_type(&name) });
                files = match (files, device.minor_number()) {
                    (Some(mut f), Ok(minor)) => {
                        f.push(std::path::PathBuf::from(format!("/dev/nvidia{minor}")));
                        Some(f)
                    }
                    _ => None,
                };
                if let Some(set) = events.take() {
                    events = device.register_events(EventTypes::CRITICAL_XID_ERROR, set).ok();
                }
            }
            let n = count as usize;
            Ok((NvmlSource { nvml, count, events, xids: vec![Vec::new(); n], replays: vec![0; n] }, gpus, files))
        }

        fn drain_events(&mut self) {
            let Some(set) = &self.events else { return };
            loop {
                match set.wait(0) {
                    Ok(data) => {
                        let index = data.device.index().unwrap_or(u32::MAX) as usize;
                        if let (Some(XidError::Value(xid)), Some(list)) = (data.event_data, self.xids.get_mut(index)) {
                            if !list.contains(&xid) {
                                list.push(xid);
                            }
                        }
                    }
                    Err(NvmlError::Timeout) => return,
                    Err(_) => return,
                }
            }
        }
    }

    /// Row remapping: (rows remapped for uncorrectable errors, pending, failed). nvml-wrapper
    /// has no wrapper for it, so the driver's function is called directly; `None` where the
    /// driver lacks it or the GPU does not remap rows (before Ampere).
    fn remapped_rows(nvml: &Nvml, device: &Device) -> Option<(u64, bool, bool)> {
        let get = nvml.lib().nvmlDeviceGetRemappedRows.as_ref().ok()?;
        let (mut corrected, mut uncorrected, mut pending, mut failed) = (0, 0, 0, 0);
        // SAFETY: the four pointers are to locals that outlive the call; the device handle
        // belongs to this NVML, which lives as long as the agent.
        let rc = unsafe { get(device.handle(), &mut corrected, &mut uncorrected, &mut pending, &mut failed) };
        (rc == 0).then_some((u64::from(uncorrected), pending != 0, failed != 0))
    }

    impl GpuSource for NvmlSource {
        fn read(&mut self) -> Vec<(u32, Result<Reading, String>)> {
            self.drain_events();
            (0..self.count)
                .map(|index| {
                    let i = index as usize;
                    let reading = self.nvml.device_by_index(index).map_err(|e| e.to_string()).map(|d| {
                        // A counter the GPU does not have (ECC off, retirement on newer GPUs) reads 0.
                        let replays = d.pcie_replay_counter().map(u64::from).unwrap_or(0);
                        let since = replays.saturating_sub(self.replays[i]);
                        self.replays[i] = replays;
                        let retired = [RetirementCause::MultipleSingleBitEccErrors, RetirementCause::DoubleBitEccError]
                            .into_iter()
                            .map(|c| d.retired_pages(c).map(|p| p.len() as u64).unwrap_or(0))
                            .sum();
                        let (remapped_rows, remap_pending, remap_failed) =
                            remapped_rows(self.nvml, &d).unwrap_or_default();
                        Reading {
                            remapped_rows,
                            remap_pending,
                            remap_failed,
                            temperature_c: d.temperature(TemperatureSensor::Gpu).unwrap_or(0),
                            ecc_uncorrectable: d
                                .total_ecc_errors(MemoryError::Uncorrected, EccCounter::Volatile)
                                .unwrap_or(0),
                            ecc_correctable: d
                                .total_ecc_errors(MemoryError::Corrected, EccCounter::Volatile)
                                .unwrap_or(0),
                            xids: self.xids[i].clone(),
                            retired_pages: retired,
                            pcie_replays: since,
                            utilization_pct: d.utilization_rates().ok().map(|u| u.gpu),
                            memory_used_mb: d.memory_info().ok().map(|m| m.used >> 20),
                            // Volta and later; older GPUs leave it out.
                            energy_mj: d.total_energy_consumption().ok(),
                        }
                    });
                    (index, reading)
                })
                .collect()
        }

        fn inject(&mut self, _gpu: u32, _fault: Fault) -> Result<(), String> {
            Err("this node's GPUs are real (NVML): faults can only be injected into simulated ones".into())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn readings_are_judged() {
        let ok = Reading { temperature_c: 50, ..Default::default() };
        assert_eq!(judge(&ok), (GpuState::GpuOk, String::new()));
        let warm = Reading { temperature_c: 90, ecc_correctable: 5000, ..Default::default() };
        assert_eq!(judge(&warm), (GpuState::GpuWarning, "5000 correctable ECC errors; temperature 90 C".into()));
        let xid = Reading { xids: vec![79], ..Default::default() };
        assert_eq!(judge(&xid), (GpuState::GpuFailure, "XID 79 (GPU has fallen off the bus)".into()));
        let app = Reading { xids: vec![13], ..Default::default() };
        assert_eq!(judge(&app).0, GpuState::GpuWarning);
        assert_eq!(judge(&Reading { ecc_uncorrectable: 1, ..Default::default() }).0, GpuState::GpuFailure);
        assert_eq!(judge(&Reading { retired_pages: 64, ..Default::default() }).0, GpuState::GpuFailure);
        assert_eq!(judge(&Reading { retired_pages: 3, ..Default::default() }).0, GpuState::GpuWarning);
        assert_eq!(judge(&Reading { pcie_replays: 500, ..Default::default() }).0, GpuState::GpuWarning);
        assert_eq!(judge(&Reading { remapped_rows: 2, ..Default::default() }).0, GpuState::GpuWarning);
        let pending = Reading { remap_pending: true, ..Default::default() };
        assert_eq!(judge(&pending), (GpuState::GpuFailure, "row remapping pending: the GPU needs a reset".into()));
        assert_eq!(judge(&Reading { remap_failed: true, ..Default::default() }).0, GpuState::GpuFailure);
    }

    #[test]
    fn faults_inject_and_clear() {
        let mut sim = SimSource::new(2);
        sim.inject(1, Fault::Xid(79)).unwrap();
        let (health, _) = check(&mut sim);
        assert_eq!(health[0].state, GpuState::GpuOk as i32);
        assert_eq!(health[1].state, GpuState::GpuFailure as i32);
        sim.inject(1, Fault::Clear).unwrap();
        assert_eq!(check(&mut sim).0[1].state, GpuState::GpuOk as i32);
        assert!(sim.inject(5, Fault::Clear).unwrap_err().contains("no GPU 5"));
    }

    #[test]
    fn a_job_s_gpus_are_sampled_for_utilization_memory_and_energy() {
        let mut sim = SimSource::new(3);
        sim.inject(0, Fault::Load(70)).unwrap();
        sim.inject(1, Fault::Load(30)).unwrap();
        sim.inject(2, Fault::Load(100)).unwrap();
        let mut used = GpuUse::default();
        let start = std::time::Instant::now();
        for _ in 0..3 {
            let (_, readings) = check(&mut sim);
            used.sample(&readings, &[0, 1]);
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
        let ms = start.elapsed().as_millis() as u64;
        // Two GPUs of the job three times; GPU 2 is another job's.
        assert_eq!((used.samples, used.util_sum), (6, 300));
        assert_eq!(used.mem_max_mb, 80 * 1024 * 70 / 100);
        // 480 W and 240 W between the first read and the last (40 ms or more apart).
        assert!((720 * 40..=720 * ms).contains(&used.energy_mj), "{} mJ in {ms} ms", used.energy_mj);
        let mut usage = quorum_proto::api::JobUsage::default();
        used.add_to(&mut usage);
        assert_eq!((usage.gpu_samples, usage.gpu_util_sum), (6, 300));
    }

    #[test]
    fn nvml_names_give_types() {
        assert_eq!(nvml::gpu_type("NVIDIA H100 80GB HBM3"), "h100");
        assert_eq!(nvml::gpu_type("NVIDIA A100-SXM4-80GB"), "a100");
        assert_eq!(nvml::gpu_type("Tesla V100-PCIE-16GB"), "v100");
    }

    #[test]
    fn nvml_is_absent_here_and_says_so() {
        // No driver on the machines the tests run on: opening NVML fails with a reason, which
        // the agent reports at start instead of failing to load.
        if let Err(e) = nvml::NvmlSource::open() {
            assert!(e.starts_with("NVML is not available"), "{e}");
        }
    }

    #[test]
    fn what_a_job_s_gpus_did_survives_its_record() {
        let mut used = GpuUse::default();
        let reading = |pct: u32, mj: u64| Reading {
            utilization_pct: Some(pct),
            memory_used_mb: Some(100),
            energy_mj: Some(mj),
            ..Default::default()
        };
        used.start(&[(0, reading(0, 1_000)), (2, reading(0, 5_000))], &[0, 2]);
        used.sample(&[(0, reading(50, 3_000)), (2, reading(70, 9_000))], &[0, 2]);
        let again = GpuUse::decode(&used.encode()).expect("decoded");
        // The busiest GPU at the last check is for the next heartbeat only: a restarted agent
        // reads it again at its first check.
        assert_eq!(used.last_util_pct, Some(70));
        assert_eq!(again, GpuUse { last_util_pct: None, ..used.clone() });
        assert_eq!((again.samples, again.util_sum, again.energy_mj), (2, 120, 6_000));
        assert_eq!(GpuUse::decode(""), None);
        assert_eq!(GpuUse::decode("1 2 3"), None);
        assert_eq!(GpuUse::decode("1 2 3 4 x:5"), None);
    }
}
