//! A job's or step's container, with pyxis's options (`--container-image`, `--container-mounts`,
//! ...), and the two things in them that have a syntax: the image reference, as enroot writes it
//! (`[USER@][REGISTRY#]IMAGE[:TAG]`), and the bind mounts (`SRC[:DST[:FLAGS]]`, flags joined by
//! `+`). Parsed here, without I/O, so that the client refuses a bad one before it is submitted and
//! the agent reads the same thing.

use serde::{Deserialize, Serialize};

/// The longest image reference, mount list entry, path or name a container spec may carry.
pub const MAX_FIELD: usize = 4096;
/// The most bind mounts one container may ask for.
pub const MAX_MOUNTS: usize = 64;

/// What `--container-*` asked for.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Container {
    /// `[USER@][REGISTRY#]IMAGE[:TAG|@DIGEST]`, or the absolute path of a squashfs file.
    pub image: String,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub mounts: Vec<String>,
    /// Empty: the image's working directory, else `/`.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub workdir: String,
    /// Kept for the job's later steps, which use it again instead of the image.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub name: String,
    /// A squashfs file written from the container when the step ends.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub save: String,
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub mount_home: bool,
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub remap_root: bool,
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub readonly: bool,
    /// Variables whose job values win over the image's.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub env: Vec<String>,
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub entrypoint: bool,
}

impl Container {
    /// Whether the image is a squashfs file rather than a registry reference.
    pub fn image_is_file(&self) -> bool {
        self.image.starts_with('/')
    }

    /// Every field checked: what is wrong, naming the option.
    pub fn check(&self) -> Result<(), String> {
        let long = |what: &str, v: &str| {
            if v.len() > MAX_FIELD {
                Err(format!("{what} is longer than {MAX_FIELD} bytes"))
            } else if v.contains('\0') || v.contains('\n') {
                Err(format!("{what} contains a NUL byte or a newline"))
            } else {
                Ok(())
            }
        };
        long("--container-image", &self.image)?;
        // `--container-name` alone: the job's container of that name, made by an earlier step.
        if self.image.trim().is_empty() && self.name.is_empty() {
            return Err(
                "--container-image is empty (give an image, or the --container-name of one made earlier in the job)"
                    .into(),
            );
        }
        if !self.image.is_empty() && !self.image_is_file() {
            ImageRef::parse(&self.image, "registry-1.docker.io")?;
        }
        if self.mounts.len() > MAX_MOUNTS {
            return Err(format!("--container-mounts lists {} mounts; at most {MAX_MOUNTS}", self.mounts.len()));
        }
        for m in &self.mounts {
            long("--container-mounts", m)?;
            Mount::parse(m)?;
        }
        long("--container-workdir", &self.workdir)?;
        if !self.workdir.is_empty() && !self.workdir.starts_with('/') {
            return Err(format!("--container-workdir '{}' is not an absolute path", self.workdir));
        }
        long("--container-name", &self.name)?;
        if !self.name.is_empty()
            && (self.name.len() > 128 || !self.name.chars().all(|c| c.is_ascii_alphanumeric() || "._-".contains(c)))
        {
            return Err(format!("--container-name '{}': use up to 128 letters, digits, '.', '_' and '-'", self.name));
        }
        long("--container-save", &self.save)?;
        if !self.save.is_empty() && !self.save.starts_with('/') {
            return Err(format!("--container-save '{}' is not an absolute path", self.save));
        }
        for name in &self.env {
            if name.is_empty() || name.len() > 256 || !name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_') {
                return Err(format!("--container-env: '{name}' is not a variable name"));
            }
        }
        Ok(())
    }
}

/// An image in a registry, as enroot names it: `[USER@][REGISTRY#]IMAGE[:TAG|@DIGEST]`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ImageRef {
    /// Whose credentials to use for the registry (`USER@`); `None`: the user's entry for it.
    pub user: Option<String>,
    /// `host[:port]`.
    pub registry: String,
    /// `library/ubuntu`, `nvidia/pytorch`.
    pub repository: String,
    /// A tag (`latest` when none is given) or a digest (`sha256:...`).
    pub reference: String,
}

impl ImageRef {
    /// Parses `text`; a reference without `REGISTRY#` is in `default_registry`, where (as on
    /// Docker Hub) a name of one part is in `library/`.
    pub fn parse(text: &str, default_registry: &str) -> Result<ImageRef, String> {
        let bad = |why: &str| Err(format!("--container-image '{text}': {why}"));
        let (user, rest) = match text.split_once('@') {
            // `name@sha256:...` is a digest, not a user.
            Some((u, r)) if !r.starts_with("sha256:") && !u.contains('#') && !u.contains('/') => {
                if u.is_empty() {
                    return bad("the user before '@' is empty");
                }
                (Some(u.to_string()), r)
            }
            _ => (None, text),
        };
        let (registry, name) = match rest.split_once('#') {
            Some((r, n)) => {
                if r.is_empty() || !r.chars().all(|c| c.is_ascii_alphanumeric() || ".-:[]".contains(c)) {
                    return bad("the registry before '#' is not a host name or host:port");
                }
                (r.to_string(), n)
            }
            None => (default_registry.to_string(), rest),
        };
        let (path, reference) = if let Some((p, d)) = name.split_once('@') {
            let hex = d.strip_prefix("sha256:").unwrap_or("");
            if hex.len() != 64 || !hex.chars().all(|c| c.is_ascii_hexdigit()) {
                return bad("a digest is sha256: and 64 hexadecimal digits");
            }
            (p, d.to_string())
        } else {
            match name.rsplit_once(':') {
                Some((p, t)) if !t.contains('/') => {
                    if t.is_empty()
                        || t.len() > 128
                        || !t.chars().all(|c| c.is_ascii_alphanumeric() || "._-".contains(c))
                    {
                        return bad("a tag has 1 to 128 letters, digits, '.', '_' or '-'");
                    }
                    (p, t.to_string())
                }
                _ => (name, "latest".to_string()),
            }
        };
        if path.is_empty() {
            return bad("no image name");
        }
        let part_ok = |p: &str| {
            !p.is_empty()
                && p.chars().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || "._-".contains(c))
                && !p.starts_with(['.', '_', '-'])
        };
        if !path.split('/').all(part_ok) {
            return bad("an image name has lowercase parts joined by '/'");
        }
        let repository = if !path.contains('/') && registry.ends_with("docker.io") {
            format!("library/{path}")
        } else {
            path.to_string()
        };
        Ok(ImageRef { user, registry, repository, reference })
    }

    /// `registry/repository:tag` or `registry/repository@digest`.
    pub fn whole(&self) -> String {
        let sep = if self.reference.starts_with("sha256:") { '@' } else { ':' };
        format!("{}/{}{sep}{}", self.registry, self.repository, self.reference)
    }
}

/// One bind mount of `--container-mounts`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Mount {
    pub source: String,
    pub target: String,
    pub readonly: bool,
    /// `rbind`: with the mounts below the source (the default is the source alone).
    pub recursive: bool,
    pub nosuid: bool,
    pub nodev: bool,
    pub noexec: bool,
}

impl Mount {
    /// `SRC[:DST[:FLAGS]]`, flags joined by `+`: `ro`, `rw`, `bind`, `rbind`, `nosuid`, `nodev`,
    /// `noexec`, and the propagation flags (`private`, `rprivate`, `slave`, `rslave`), which
    /// change nothing here (every container mount is private).
    pub fn parse(text: &str) -> Result<Mount, String> {
        let bad = |why: String| Err(format!("--container-mounts '{text}': {why}"));
        let mut parts = text.splitn(3, ':');
        let source = parts.next().unwrap_or_default().to_string();
        let target = parts.next().map(str::to_string).unwrap_or_else(|| source.clone());
        let flags = parts.next().unwrap_or("");
        if !source.starts_with('/') {
            return bad(format!("the source '{source}' is not an absolute path"));
        }
        if !target.starts_with('/') {
            return bad(format!("the destination '{target}' is not an absolute path"));
        }
        if target.split('/').any(|p| p == "..") {
            return bad("the destination has a '..'".into());
        }
        let mut m =
            Mount { source, target, readonly: false, recursive: false, nosuid: false, nodev: false, noexec: false };
        for flag in flags.split('+').filter(|f| !f.is_empty()) {
            match flag {
                "ro" => m.readonly = true,
                "rw" => m.readonly = false,
                "bind" => m.recursive = false,
                "rbind" => m.recursive = true,
                "nosuid" => m.nosuid = true,
                "nodev" => m.nodev = true,
                "noexec" => m.noexec = true,
                "private" | "rprivate" | "slave" | "rslave" => {}
                other => {
                    return bad(format!(
                        "unknown flag '{other}' (flags: ro, rw, bind, rbind, nosuid, nodev, noexec, private, rprivate, slave, rslave)"
                    ))
                }
            }
        }
        Ok(m)
    }
}

/// pyxis options that are not built here: refused by name rather than ignored.
pub const UNSUPPORTED_OPTIONS: &[&str] = &["--container-entrypoint-log"];

#[cfg(test)]
mod tests {
    use super::*;

    fn r(text: &str) -> ImageRef {
        ImageRef::parse(text, "registry-1.docker.io").unwrap()
    }

    #[test]
    fn image_references_read_as_enroot_reads_them() {
        let u = r("ubuntu");
        assert_eq!(
            (u.registry.as_str(), u.repository.as_str(), u.reference.as_str()),
            ("registry-1.docker.io", "library/ubuntu", "latest")
        );
        let n = r("nvcr.io#nvidia/pytorch:24.05-py3");
        assert_eq!(
            (n.registry.as_str(), n.repository.as_str(), n.reference.as_str()),
            ("nvcr.io", "nvidia/pytorch", "24.05-py3")
        );
        assert_eq!(n.user, None);
        let p = r("alice@127.0.0.1:5000#test/busybox:1");
        assert_eq!(p.user.as_deref(), Some("alice"));
        assert_eq!(
            (p.registry.as_str(), p.repository.as_str(), p.reference.as_str()),
            ("127.0.0.1:5000", "test/busybox", "1")
        );
        assert_eq!(p.whole(), "127.0.0.1:5000/test/busybox:1");
        let digest = format!("sha256:{}", "a".repeat(64));
        let d = r(&format!("reg.example#x/y@{digest}"));
        assert_eq!(d.reference, digest);
        assert_eq!(d.whole(), format!("reg.example/x/y@{digest}"));
        for bad in ["", "Ubuntu", "reg#", "#x", "x:", "x@sha256:12", "@x", "x/../y", "a:b c"] {
            assert!(ImageRef::parse(bad, "registry-1.docker.io").is_err(), "{bad}");
        }
    }

    #[test]
    fn mounts_read_as_pyxis_reads_them() {
        let m = Mount::parse("/data:/in:ro+rprivate").unwrap();
        assert_eq!((m.source.as_str(), m.target.as_str(), m.readonly, m.recursive), ("/data", "/in", true, false));
        let same = Mount::parse("/scratch").unwrap();
        assert_eq!(same.target, "/scratch");
        assert!(Mount::parse("/a:/b:rbind").unwrap().recursive);
        assert!(Mount::parse("rel:/b").unwrap_err().contains("absolute"));
        assert!(Mount::parse("/a:b").unwrap_err().contains("absolute"));
        assert!(Mount::parse("/a:/b/../../etc").unwrap_err().contains(".."));
        assert!(Mount::parse("/a:/b:suid").unwrap_err().contains("unknown flag 'suid'"));
    }

    #[test]
    fn a_container_spec_is_checked_whole() {
        let ok = Container { image: "127.0.0.1:5000#t/b:1".into(), ..Default::default() };
        assert!(ok.check().is_ok());
        let file = Container { image: "/images/x.sqsh".into(), ..Default::default() };
        assert!(file.image_is_file() && file.check().is_ok());
        let named = |f: fn(&mut Container)| {
            let mut c = ok.clone();
            f(&mut c);
            c.check().unwrap_err()
        };
        assert!(named(|c| c.workdir = "rel".into()).contains("--container-workdir"));
        assert!(named(|c| c.name = "a/b".into()).contains("--container-name"));
        assert!(named(|c| c.save = "x.sqsh".into()).contains("--container-save"));
        assert!(named(|c| c.env = vec!["A-B".into()]).contains("--container-env"));
        assert!(named(|c| c.mounts = vec!["/a:/b".into(); MAX_MOUNTS + 1]).contains("at most"));
        assert!(named(|c| c.image = " ".into()).contains("empty"));
    }
}
