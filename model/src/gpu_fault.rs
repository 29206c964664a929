//! GPU faults an operator may inject into an agent's simulated GPUs to drill what a failing GPU
//! does (`quorum admin gpu-fault`): the grammar, shared by the leader (which refuses a bad kind
//! before it reaches an agent) and the agent (which applies it).

/// A fault injected into a simulated GPU.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Fault {
    Xid(u64),
    EccUncorrectable(u64),
    EccCorrectable(u64),
    Temperature(u32),
    RetiredPages(u64),
    PcieReplay(u64),
    RemappedRows(u64),
    RemapPending,
    RemapFailed,
    /// The GPU is healthy again (reset or replaced).
    Clear,
    /// Not a fault: the simulated GPU reports this utilization (percent), the memory and power
    /// that go with it, as if a job kept it that busy (`load:0` when idle, as it starts).
    Load(u32),
}

/// `xid:N`, `ecc-uncorrectable[:N]`, `ecc-correctable:N`, `temperature:C`, `retired-pages:N`,
/// `pcie-replay:N`, `remapped-rows:N`, `remap-pending`, `remap-failed` or `clear`; or
/// `load:PERCENT`, a simulated load.
pub fn parse_fault(kind: &str) -> Result<Fault, String> {
    let (name, value) = match kind.trim().split_once(':') {
        Some((n, v)) => (n, Some(v)),
        None => (kind.trim(), None),
    };
    let number = |what: &str| -> Result<u64, String> {
        let v = value.ok_or_else(|| format!("GPU fault '{kind}' needs a number: {what}:N"))?;
        v.parse().map_err(|_| format!("GPU fault '{kind}': '{v}' is not a number"))
    };
    Ok(match name {
        "xid" => Fault::Xid(number("xid")?),
        "ecc-uncorrectable" if value.is_none() => Fault::EccUncorrectable(1),
        "ecc-uncorrectable" => Fault::EccUncorrectable(number("ecc-uncorrectable")?),
        "ecc-correctable" => Fault::EccCorrectable(number("ecc-correctable")?),
        "temperature" => Fault::Temperature(u32::try_from(number("temperature")?).map_err(|_| "temperature too high")?),
        "retired-pages" => Fault::RetiredPages(number("retired-pages")?),
        "pcie-replay" => Fault::PcieReplay(number("pcie-replay")?),
        "remapped-rows" => Fault::RemappedRows(number("remapped-rows")?),
        "remap-pending" if value.is_none() => Fault::RemapPending,
        "remap-failed" if value.is_none() => Fault::RemapFailed,
        "clear" if value.is_none() => Fault::Clear,
        "load" => match number("load")? {
            pct @ 0..=100 => Fault::Load(pct as u32),
            pct => return Err(format!("GPU load {pct}: a utilization is a percentage, 0 to 100")),
        },
        _ => {
            return Err(format!(
                "unknown GPU fault '{kind}': expected xid:N, ecc-uncorrectable, ecc-correctable:N, temperature:C, retired-pages:N, pcie-replay:N, remapped-rows:N, remap-pending, remap-failed, clear or load:PERCENT"
            ))
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn faults_parse() {
        assert_eq!(parse_fault("xid:79"), Ok(Fault::Xid(79)));
        assert_eq!(parse_fault("ecc-uncorrectable"), Ok(Fault::EccUncorrectable(1)));
        assert_eq!(parse_fault("temperature:99"), Ok(Fault::Temperature(99)));
        assert_eq!(parse_fault("clear"), Ok(Fault::Clear));
        assert_eq!(parse_fault("load:75"), Ok(Fault::Load(75)));
        assert!(parse_fault("load:101").unwrap_err().contains("0 to 100"));
        assert!(parse_fault("xid").unwrap_err().contains("needs a number"));
        assert!(parse_fault("xid:abc").unwrap_err().contains("'abc' is not a number"));
        assert!(parse_fault("melted").unwrap_err().contains("unknown GPU fault 'melted'"));
        assert!(parse_fault("clear:1").unwrap_err().contains("unknown GPU fault"));
    }
}
