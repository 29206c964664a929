//! pyxis's options, on `srun`, `salloc` and `sbatch` (and `#SBATCH` lines), with pyxis's
//! spellings and meanings: `--container-image` and the others turn into the job's or step's
//! [`api::Container`].

use std::path::Path;

use quorum_model::container::{Container, UNSUPPORTED_OPTIONS};
use quorum_proto::api;

// The container a job or step runs in (pyxis's options). (Not a doc comment: see
// `SubmitOpts`.)
#[derive(clap::Args, Debug, Default, Clone)]
pub struct ContainerOpts {
    /// Run in a container of this image: `[USER@][REGISTRY#]IMAGE[:TAG]` (enroot's form, as
    /// `nvcr.io#nvidia/pytorch:24.05-py3`), or the path of a squashfs file on the nodes.
    #[arg(long)]
    pub container_image: Option<String>,
    /// Bind mounts into the container: `SRC[:DST[:FLAGS]]`, comma-separated, flags joined by
    /// `+` (`ro`, `rbind`, `nosuid`, `nodev`, `noexec`, `rprivate`, ...).
    #[arg(long)]
    pub container_mounts: Option<String>,
    /// The working directory inside the container (default: the image's, else `/`).
    #[arg(long)]
    pub container_workdir: Option<String>,
    /// Keep the container under this name for the job's later steps, which use it again (with
    /// what earlier steps wrote into it); unnamed containers are removed when their step ends.
    #[arg(long)]
    pub container_name: Option<String>,
    /// Save the container, as the step left it, to this squashfs file on the node (usable
    /// again as `--container-image=PATH`).
    #[arg(long)]
    pub container_save: Option<String>,
    /// Bind mount the user's home directory into the container.
    #[arg(long, overrides_with = "no_container_mount_home")]
    pub container_mount_home: bool,
    /// Do not bind mount the user's home directory (the default).
    #[arg(long, overrides_with = "container_mount_home")]
    pub no_container_mount_home: bool,
    /// Be root (uid 0) inside the container; still the user outside: it grants no privilege on
    /// the node.
    #[arg(long, overrides_with = "no_container_remap_root")]
    pub container_remap_root: bool,
    /// Keep the user's own uid inside the container (the default).
    #[arg(long, overrides_with = "container_remap_root")]
    pub no_container_remap_root: bool,
    /// The container's file system is writable (the default); what is written stays with the
    /// container (a named one keeps it for later steps).
    #[arg(long, overrides_with = "container_readonly")]
    pub container_writable: bool,
    /// The container's file system is read-only.
    #[arg(long, overrides_with = "container_writable")]
    pub container_readonly: bool,
    /// Variables (comma-separated names) whose job values win over the image's; the image's
    /// win for the others it sets (`PATH`, ...).
    #[arg(long)]
    pub container_env: Option<String>,
    /// Run the image's entrypoint, with the command as its arguments.
    #[arg(long, overrides_with = "no_container_entrypoint")]
    pub container_entrypoint: bool,
    /// Do not run the image's entrypoint (the default).
    #[arg(long, overrides_with = "container_entrypoint")]
    pub no_container_entrypoint: bool,
    /// pyxis's `--container-entrypoint-log`: not built here, refused by name.
    #[arg(long, hide = true, num_args = 0..=1, default_missing_value = "")]
    pub container_entrypoint_log: Option<String>,
}

impl ContainerOpts {
    /// `self`, with every option it lacks taken from `other` (the command line over `#SBATCH`).
    pub fn or(self, other: ContainerOpts) -> ContainerOpts {
        let pick = |mine: bool, not_mine: bool, theirs: bool, not_theirs: bool| {
            if mine || not_mine {
                (mine, not_mine)
            } else {
                (theirs, not_theirs)
            }
        };
        let (container_mount_home, no_container_mount_home) = pick(
            self.container_mount_home,
            self.no_container_mount_home,
            other.container_mount_home,
            other.no_container_mount_home,
        );
        let (container_remap_root, no_container_remap_root) = pick(
            self.container_remap_root,
            self.no_container_remap_root,
            other.container_remap_root,
            other.no_container_remap_root,
        );
        let (container_writable, container_readonly) =
            pick(self.container_writable, self.container_readonly, other.container_writable, other.container_readonly);
        let (container_entrypoint, no_container_entrypoint) = pick(
            self.container_entrypoint,
            self.no_container_entrypoint,
            other.container_entrypoint,
            other.no_container_entrypoint,
        );
        ContainerOpts {
            container_image: self.container_image.or(other.container_image),
            container_mounts: self.container_mounts.or(other.container_mounts),
            container_workdir: self.container_workdir.or(other.container_workdir),
            container_name: self.container_name.or(other.container_name),
            container_save: self.container_save.or(other.container_save),
            container_mount_home,
            no_container_mount_home,
            container_remap_root,
            no_container_remap_root,
            container_writable,
            container_readonly,
            container_env: self.container_env.or(other.container_env),
            container_entrypoint,
            no_container_entrypoint,
            container_entrypoint_log: self.container_entrypoint_log.or(other.container_entrypoint_log),
        }
    }

    /// Whether any container option was given.
    fn any(&self) -> bool {
        self.container_image.is_some()
            || self.container_mounts.is_some()
            || self.container_workdir.is_some()
            || self.container_name.is_some()
            || self.container_save.is_some()
            || self.container_mount_home
            || self.container_remap_root
            || self.container_readonly
            || self.container_env.is_some()
            || self.container_entrypoint
    }

    /// The container asked for, checked, with relative paths made absolute against `cwd`;
    /// `None` without one. A squashfs file that this host can see is missing is refused here.
    pub fn spec(&self, cwd: &Path) -> Result<Option<api::Container>, String> {
        if self.container_entrypoint_log.is_some() {
            return Err(format!(
                "{} is pyxis's, and not supported here (the entrypoint's output goes to the task's own)",
                UNSUPPORTED_OPTIONS[0]
            ));
        }
        if !self.any() {
            return Ok(None);
        }
        if self.container_image.is_none() && self.container_name.is_none() {
            return Err("the --container-* options need --container-image (or --container-name, to use a container an earlier step of the job made)".into());
        }
        let absolute = |p: &str| {
            if p.starts_with('/') {
                p.to_string()
            } else {
                cwd.join(p).display().to_string()
            }
        };
        let mut image = self.container_image.clone().unwrap_or_default();
        // A path (`./x.sqsh`, `/images/x.sqsh`, `x.sqsh`) rather than an image reference.
        if image.starts_with('.') || image.ends_with(".sqsh") || image.ends_with(".squashfs") {
            image = absolute(&image);
        }
        if image.starts_with('/') {
            let path = Path::new(&image);
            // Refused only where this host sees the directory: the file may be on the nodes alone.
            if path.parent().is_some_and(|d| d.is_dir()) && !path.exists() {
                return Err(format!("--container-image '{image}': no such squashfs file"));
            }
        }
        let split = |list: &Option<String>| -> Vec<String> {
            list.as_deref()
                .map(|l| l.split(',').map(str::trim).filter(|m| !m.is_empty()).map(str::to_string).collect())
                .unwrap_or_default()
        };
        let container = Container {
            image,
            mounts: split(&self.container_mounts),
            workdir: self.container_workdir.clone().unwrap_or_default(),
            name: self.container_name.clone().unwrap_or_default(),
            save: self.container_save.as_deref().map(absolute).unwrap_or_default(),
            mount_home: self.container_mount_home,
            remap_root: self.container_remap_root,
            readonly: self.container_readonly,
            env: split(&self.container_env),
            entrypoint: self.container_entrypoint,
        };
        container.check()?;
        Ok(Some(api::Container {
            image: container.image,
            mounts: container.mounts,
            workdir: container.workdir,
            name: container.name,
            save: container.save,
            mount_home: container.mount_home,
            remap_root: container.remap_root,
            readonly: container.readonly,
            env: container.env,
            entrypoint: container.entrypoint,
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    #[command(no_binary_name = true)]
    struct Line {
        #[command(flatten)]
        c: ContainerOpts,
    }

    fn spec(args: &[&str]) -> Result<Option<api::Container>, String> {
        Line::try_parse_from(args).map_err(|e| e.to_string())?.c.spec(Path::new("/work"))
    }

    #[test]
    fn pyxis_options_make_the_container() {
        assert_eq!(spec(&[]).unwrap(), None);
        let c = spec(&[
            "--container-image=127.0.0.1:5000#test/busybox:1",
            "--container-mounts=/data:/data:ro,/scratch",
            "--container-workdir=/data",
            "--container-name=train",
            "--container-remap-root",
            "--container-readonly",
            "--container-env=PATH,HOME",
            "--container-save=out.sqsh",
        ])
        .unwrap()
        .unwrap();
        assert_eq!(c.image, "127.0.0.1:5000#test/busybox:1");
        assert_eq!(c.mounts, ["/data:/data:ro", "/scratch"]);
        assert_eq!((c.workdir.as_str(), c.name.as_str(), c.save.as_str()), ("/data", "train", "/work/out.sqsh"));
        assert!(c.remap_root && c.readonly && !c.mount_home && !c.entrypoint);
        assert_eq!(c.env, ["PATH", "HOME"]);
        let later_wins =
            spec(&["--container-image=x", "--container-remap-root", "--no-container-remap-root"]).unwrap().unwrap();
        assert!(!later_wins.remap_root);
    }

    #[test]
    fn bad_container_options_are_refused_by_name() {
        assert!(spec(&["--container-mounts=/a:/b"]).unwrap_err().contains("need --container-image"));
        assert!(spec(&["--container-image=x", "--container-mounts=/a:b"]).unwrap_err().contains("--container-mounts"));
        assert!(spec(&["--container-image=x", "--container-entrypoint-log"])
            .unwrap_err()
            .contains("--container-entrypoint-log"));
        assert!(spec(&["--container-image=Bad Image"]).unwrap_err().contains("--container-image"));
        let gone = spec(&["--container-image=/tmp/quorum-no-such-image.sqsh"]).unwrap_err();
        assert!(gone.contains("no such squashfs file"), "{gone}");
        // Only the name: the job's container of that name.
        assert!(spec(&["--container-name=train"]).unwrap().is_some());
    }

    #[test]
    fn the_command_line_wins_over_sbatch_lines() {
        let cli = Line::try_parse_from(["--container-readonly"]).unwrap().c;
        let script = Line::try_parse_from(["--container-image=x", "--container-writable"]).unwrap().c;
        let c = cli.or(script).spec(Path::new("/")).unwrap().unwrap();
        assert!(c.readonly);
        assert_eq!(c.image, "x");
    }
}
