//! What the node has: CPUs and memory detected from the OS (or overridden), and GPUs.

/// A GPU the agent advertises.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SimGpu {
    pub index: u32,
    pub gpu_type: String,
}

/// Parses a GPU source: `none`, or `sim:TYPExCOUNT` such as `sim:h100x8` (several separated by
/// commas: `sim:h100x4,a100x2`).
pub fn parse_gpu_source(spec: &str) -> Result<Vec<SimGpu>, String> {
    let spec = spec.trim();
    if spec.is_empty() || spec == "none" {
        return Ok(Vec::new());
    }
    let rest = spec
        .strip_prefix("sim:")
        .ok_or_else(|| format!("unknown GPU source '{spec}': expected 'nvml', 'none' or 'sim:TYPExCOUNT'"))?;
    let mut gpus = Vec::new();
    for part in rest.split(',') {
        let (ty, count) = part
            .rsplit_once('x')
            .ok_or_else(|| format!("bad GPU spec '{part}': expected TYPExCOUNT such as h100x8"))?;
        let count: u32 = count.parse().map_err(|_| format!("bad GPU count in '{part}': '{count}' is not a number"))?;
        if ty.is_empty() || ty.contains(':') {
            return Err(format!("bad GPU type in '{part}'"));
        }
        for _ in 0..count {
            gpus.push(SimGpu { index: gpus.len() as u32, gpu_type: ty.to_string() });
        }
    }
    Ok(gpus)
}

/// CPUs the OS offers this process.
pub fn detect_cpus() -> u32 {
    std::thread::available_parallelism().map(|n| n.get() as u32).unwrap_or(1)
}

/// Total memory in MiB from /proc/meminfo.
pub fn detect_mem_mb() -> u64 {
    std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("MemTotal:"))
                .and_then(|l| l.split_whitespace().nth(1).and_then(|kb| kb.parse::<u64>().ok()))
        })
        .map(|kb| kb / 1024)
        .unwrap_or(1024)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gpu_sources() {
        let g = parse_gpu_source("sim:h100x2,a100x1").unwrap();
        assert_eq!(g.len(), 3);
        assert_eq!(g[2], SimGpu { index: 2, gpu_type: "a100".into() });
        assert!(parse_gpu_source("none").unwrap().is_empty());
        assert!(parse_gpu_source("nvml").unwrap_err().contains("unknown GPU source"));
        assert!(parse_gpu_source("sim:h100xq").unwrap_err().contains("'q' is not a number"));
    }
}
