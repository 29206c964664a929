//! Which GPUs a job may open. `CUDA_VISIBLE_DEVICES` only tells a program which GPUs to use; a
//! job can unset it and open every `/dev/nvidiaN` of the node. As Slurm's `ConstrainDevices=yes`
//! does, the job's cgroup refuses the device files of the node's other GPUs: with cgroup v1 through
//! the devices controller's `devices.deny`, with cgroup v2 (which has no devices controller)
//! through a small eBPF program of type `BPF_PROG_TYPE_CGROUP_DEVICE` attached to the job's cgroup.
//! Everything else (the driver's control files, `/dev/null`, the job's own GPUs) stays open.
//!
//! The agent learns each GPU's device file from NVML (`/dev/nvidia<minor>`) or from the operator
//! (`--gpu-files /dev/nvidia[0-3]`, by GPU index), and its device number from the file itself.

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::path::{Path, PathBuf};

/// A character device's number.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Device {
    pub major: u32,
    pub minor: u32,
}

impl Device {
    /// The character device `path` is; an error names the file and what it is instead.
    pub fn of(path: &Path) -> Result<Device, String> {
        let meta = std::fs::metadata(path).map_err(|e| format!("GPU device file {}: {e}", path.display()))?;
        if !meta.file_type().is_char_device() {
            return Err(format!("GPU device file {} is not a character device", path.display()));
        }
        let rdev = meta.rdev();
        Ok(Device { major: libc::major(rdev), minor: libc::minor(rdev) })
    }

    /// cgroup v1's rule for it: `c MAJOR:MINOR rwm`.
    pub fn v1_rule(&self) -> String {
        format!("c {}:{} rwm", self.major, self.minor)
    }
}

/// The device files `--gpu-files` names, by GPU index: a list in hostlist syntax
/// (`/dev/nvidia[0-3]`, `/dev/nvidia0,/dev/nvidia2`).
pub fn expand_files(expr: &str) -> Result<Vec<PathBuf>, String> {
    let files = quorum_model::hostlist::expand_at_most(expr, 4096).map_err(|e| format!("--gpu-files '{expr}': {e}"))?;
    Ok(files.into_iter().map(PathBuf::from).collect())
}

/// Each GPU's device number, by index, from its file; `files` must name one per GPU.
pub fn resolve(files: &[PathBuf], gpus: usize) -> Result<Vec<Device>, String> {
    if files.len() != gpus {
        return Err(format!("{} GPU device files for {gpus} GPUs: name one file per GPU, in index order", files.len()));
    }
    files.iter().map(|f| Device::of(f)).collect()
}

/// The device files of the GPUs `own` (indexes), where known: what a job's container shows.
pub fn own(devices: &[Device], own: &[u32]) -> Vec<Device> {
    own.iter().filter_map(|&i| devices.get(i as usize).copied()).collect()
}

/// The devices of the node's GPUs that a job holding `own` (GPU indices) may not open.
pub fn others(devices: &[Device], own: &[u32]) -> Vec<Device> {
    devices.iter().enumerate().filter(|(i, _)| !own.contains(&(*i as u32))).map(|(_, d)| *d).collect()
}

// The eBPF program, instruction by instruction (linux/bpf.h). Its context is
// `struct bpf_cgroup_dev_ctx { u32 access_type; u32 major; u32 minor; }`, the device's type in
// the low 16 bits of `access_type`; it returns 1 to allow the access and 0 to refuse it.
const BPF_LDX_MEM_W: u8 = 0x61;
const BPF_ALU64_AND_K: u8 = 0x57;
const BPF_ALU64_MOV_K: u8 = 0xb7;
const BPF_JMP_JNE_K: u8 = 0x55;
const BPF_JMP_JEQ_K: u8 = 0x15;
const BPF_JMP_EXIT: u8 = 0x95;
const BPF_DEVCG_DEV_CHAR: i32 = 2;

#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Insn {
    code: u8,
    /// dst in the low nibble, src in the high one.
    regs: u8,
    off: i16,
    imm: i32,
}

fn insn(code: u8, dst: u8, src: u8, off: i16, imm: i32) -> Insn {
    Insn { code, regs: (src << 4) | (dst & 0xf), off, imm }
}

/// A program that refuses every access to the character devices `deny` and allows the rest.
fn deny_program(deny: &[Device]) -> Vec<Insn> {
    let mut p = vec![
        insn(BPF_LDX_MEM_W, 2, 1, 0, 0),                  // r2 = ctx->access_type
        insn(BPF_ALU64_AND_K, 2, 0, 0, 0xffff),           // r2 &= 0xffff (the device's type)
        insn(BPF_JMP_JNE_K, 2, 0, 0, BPF_DEVCG_DEV_CHAR), // not a character device: allow (patched)
        insn(BPF_LDX_MEM_W, 3, 1, 4, 0),                  // r3 = ctx->major
        insn(BPF_LDX_MEM_W, 4, 1, 8, 0),                  // r4 = ctx->minor
    ];
    let to_allow_from_type = p.len() - 3;
    let mut to_deny = Vec::new();
    for d in deny {
        // if major != d.major skip the next; if minor == d.minor refuse.
        p.push(insn(BPF_JMP_JNE_K, 3, 0, 1, d.major as i32));
        to_deny.push(p.len());
        p.push(insn(BPF_JMP_JEQ_K, 4, 0, 0, d.minor as i32));
    }
    let allow = p.len();
    p.push(insn(BPF_ALU64_MOV_K, 0, 0, 0, 1));
    p.push(insn(BPF_JMP_EXIT, 0, 0, 0, 0));
    let deny_at = p.len();
    p.push(insn(BPF_ALU64_MOV_K, 0, 0, 0, 0));
    p.push(insn(BPF_JMP_EXIT, 0, 0, 0, 0));
    // A jump goes to its own index + 1 + off.
    p[to_allow_from_type].off = (allow - to_allow_from_type - 1) as i16;
    for at in to_deny {
        p[at].off = (deny_at - at - 1) as i16;
    }
    p
}

const BPF_PROG_LOAD: libc::c_long = 5;
const BPF_PROG_ATTACH: libc::c_long = 8;
const BPF_PROG_TYPE_CGROUP_DEVICE: u32 = 15;
const BPF_CGROUP_DEVICE: u32 = 6;
const BPF_F_ALLOW_MULTI: u32 = 2;

/// `union bpf_attr`, as wide as any kernel reads for these two commands; what is not set is zero.
#[repr(C, align(8))]
struct Attr([u8; 128]);

impl Attr {
    fn put_u32(&mut self, at: usize, v: u32) {
        self.0[at..at + 4].copy_from_slice(&v.to_ne_bytes());
    }
    fn put_u64(&mut self, at: usize, v: u64) {
        self.0[at..at + 8].copy_from_slice(&v.to_ne_bytes());
    }
}

fn bpf(cmd: libc::c_long, attr: &mut Attr) -> io::Result<libc::c_long> {
    // SAFETY: the attribute buffer outlives the call and is as large as the size passed; what
    // it points to (instructions, license, log) is kept alive by the caller.
    let r = unsafe { libc::syscall(libc::SYS_bpf, cmd, attr as *mut Attr, std::mem::size_of::<Attr>() as u32) };
    if r < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(r)
    }
}

/// Loads the program that refuses `deny`; its verifier's words on failure.
fn load(deny: &[Device]) -> io::Result<OwnedFd> {
    let insns = deny_program(deny);
    let license = c"GPL";
    let mut log = vec![0u8; 4096];
    let mut attr = Attr([0; 128]);
    attr.put_u32(0, BPF_PROG_TYPE_CGROUP_DEVICE);
    attr.put_u32(4, insns.len() as u32);
    attr.put_u64(8, insns.as_ptr() as u64);
    attr.put_u64(16, license.as_ptr() as u64);
    attr.put_u32(24, 1); // log_level
    attr.put_u32(28, log.len() as u32);
    attr.put_u64(32, log.as_mut_ptr() as u64);
    attr.put_u32(68, BPF_CGROUP_DEVICE); // expected_attach_type
    match bpf(BPF_PROG_LOAD, &mut attr) {
        // SAFETY: a successful BPF_PROG_LOAD returns a new file descriptor this process owns.
        Ok(fd) => Ok(unsafe { OwnedFd::from_raw_fd(fd as i32) }),
        Err(e) => {
            let words =
                String::from_utf8_lossy(&log[..log.iter().position(|&b| b == 0).unwrap_or(0)]).trim().to_string();
            Err(io::Error::new(
                e.kind(),
                if words.is_empty() {
                    format!("loading the device filter: {e}")
                } else {
                    format!("loading the device filter: {e}: {words}")
                },
            ))
        }
    }
}

/// Attaches to the cgroup v2 directory `cgroup` a filter refusing `deny` to its processes.
pub fn attach_v2(cgroup: &Path, deny: &[Device]) -> io::Result<()> {
    if deny.is_empty() {
        return Ok(());
    }
    let program = load(deny)?;
    let dir = std::fs::File::open(cgroup)?;
    let mut attr = Attr([0; 128]);
    attr.put_u32(0, dir.as_raw_fd() as u32);
    attr.put_u32(4, program.as_raw_fd() as u32);
    attr.put_u32(8, BPF_CGROUP_DEVICE);
    attr.put_u32(12, BPF_F_ALLOW_MULTI);
    bpf(BPF_PROG_ATTACH, &mut attr)
        .map_err(|e| io::Error::new(e.kind(), format!("attaching the device filter to {}: {e}", cgroup.display())))?;
    // The cgroup holds the program now; it goes when the cgroup is removed.
    Ok(())
}

/// Whether this kernel lets the agent load a device filter (cgroup v2 nodes).
pub fn v2_supported() -> Result<(), String> {
    load(&[Device { major: 0, minor: 0 }]).map(drop).map_err(|e| e.to_string())
}

/// Refuses `deny` to the processes of the cgroup v1 devices directory `dir`.
pub fn deny_v1(dir: &Path, deny: &[Device]) -> io::Result<()> {
    for d in deny {
        std::fs::write(dir.join("devices.deny"), d.v1_rule()).map_err(|e| {
            io::Error::new(
                e.kind(),
                format!("writing '{}' to {}: {e}", d.v1_rule(), dir.join("devices.deny").display()),
            )
        })?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::process::CommandExt;

    #[test]
    fn the_program_refuses_exactly_the_listed_devices() {
        let p = deny_program(&[Device { major: 195, minor: 1 }, Device { major: 195, minor: 3 }]);
        // 5 to read the context, 2 per device, 2 to allow, 2 to refuse.
        assert_eq!(p.len(), 5 + 4 + 4);
        // Not a character device: straight to "allow" (index 9).
        assert_eq!((p[2].code, 2 + 1 + p[2].off as usize), (BPF_JMP_JNE_K, 9));
        // Each minor match jumps to "refuse" (index 11); a major mismatch skips its minor test.
        assert_eq!((p[6].imm, 6 + 1 + p[6].off as usize), (1, 11));
        assert_eq!((p[8].imm, 8 + 1 + p[8].off as usize), (3, 11));
        assert_eq!((p[5].code, p[5].imm, p[5].off), (BPF_JMP_JNE_K, 195, 1));
        assert_eq!((p[9].imm, p[11].imm), (1, 0));
        assert_eq!(insn(BPF_LDX_MEM_W, 3, 1, 4, 0).regs, 0x13);
    }

    /// Whether the file system of `path` ignores device files (`nodev`).
    fn nodev(path: &Path) -> bool {
        let c = std::ffi::CString::new(path.as_os_str().as_encoded_bytes()).unwrap();
        // SAFETY: statvfs fills the struct it is given; the path is NUL-terminated.
        let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
        (unsafe { libc::statvfs(c.as_ptr(), &mut st) } == 0) && st.f_flag & libc::ST_NODEV != 0
    }

    #[test]
    fn files_by_index_and_what_a_job_may_not_open() {
        assert_eq!(
            expand_files("/dev/nvidia[0-2]").unwrap(),
            ["/dev/nvidia0", "/dev/nvidia1", "/dev/nvidia2"].map(PathBuf::from)
        );
        let err = resolve(&[PathBuf::from("/dev/null")], 2).unwrap_err();
        assert!(err.contains("1 GPU device files for 2 GPUs"), "{err}");
        let err = Device::of(Path::new("/etc/hostname")).unwrap_err();
        assert!(err.contains("/etc/hostname is not a character device"), "{err}");
        assert_eq!(Device::of(Path::new("/dev/null")).unwrap(), Device { major: 1, minor: 3 });
        let devs = [Device { major: 195, minor: 0 }, Device { major: 195, minor: 1 }, Device { major: 195, minor: 2 }];
        assert_eq!(others(&devs, &[1]), [devs[0], devs[2]]);
        assert_eq!(Device { major: 195, minor: 2 }.v1_rule(), "c 195:2 rwm");
    }

    /// Where this process is root and the kernel has a cgroup v2 hierarchy (mounted at
    /// /sys/fs/cgroup, or beside v1 at /sys/fs/cgroup/unified as on this project's CI), a cgroup
    /// with the filter cannot open a refused device while it can open its own: made with mknod,
    /// with no driver behind them, one fails with EPERM (the filter) and the other gets as far as
    /// the driver (ENXIO).
    #[test]
    fn a_cgroup_v2_with_the_filter_cannot_open_the_refused_device() {
        let base = ["/sys/fs/cgroup/unified", "/sys/fs/cgroup"]
            .map(Path::new)
            .into_iter()
            .find(|p| p.join("cgroup.procs").exists() && p.join("cgroup.subtree_control").exists());
        let Some(base) = base else {
            eprintln!("skipped: no cgroup v2 hierarchy here");
            return;
        };
        if !crate::identity::is_root() {
            eprintln!("skipped: not root");
            return;
        }
        // Device files need a file system mounted without `nodev` (a tmpfs /tmp often is not).
        let Some(dir) = [std::env::temp_dir(), PathBuf::from("/var/tmp")]
            .iter()
            .filter_map(|base| tempfile::tempdir_in(base).ok())
            .find(|d| !nodev(d.path()))
        else {
            eprintln!("skipped: no temporary directory here allows device files");
            return;
        };
        let mk = |name: &str, minor: u32| {
            let path = dir.path().join(name);
            let c = std::ffi::CString::new(path.as_os_str().as_encoded_bytes()).unwrap();
            // SAFETY: mknod reads the NUL-terminated path only.
            assert_eq!(unsafe { libc::mknod(c.as_ptr(), libc::S_IFCHR | 0o666, libc::makedev(195, minor)) }, 0);
            path
        };
        let (own, other) = (mk("nvidia0", 200), mk("nvidia1", 201));
        struct Removed(PathBuf);
        impl Drop for Removed {
            fn drop(&mut self) {
                let _ = std::fs::remove_dir(&self.0);
            }
        }
        let cgroup = base.join(format!("quorum-devtest-{}", std::process::id()));
        std::fs::create_dir_all(&cgroup).unwrap();
        let _removed = Removed(cgroup.clone());
        attach_v2(&cgroup, &[Device { major: 195, minor: 201 }]).unwrap();
        let procs = cgroup.join("cgroup.procs");
        // What the shell says opening `path` in a child that joined the cgroup first.
        let words = |path: &Path| {
            let procs = procs.clone();
            let out = unsafe {
                std::process::Command::new("sh")
                    .arg("-c")
                    .arg(format!("exec 3<'{}'", path.display()))
                    .pre_exec(move || std::fs::write(&procs, std::process::id().to_string()))
                    .output()
                    .unwrap()
            };
            String::from_utf8_lossy(&out.stderr).to_string()
        };
        let (refused, allowed, null) = (words(&other), words(&own), words(Path::new("/dev/null")));
        assert!(refused.contains("Operation not permitted"), "{refused}");
        assert!(allowed.contains("No such device"), "{allowed}");
        assert_eq!(null, "");
    }
}
