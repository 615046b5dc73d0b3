//! The container image, built and run here without a registry or a daemon: `buildah`
//! (vfs storage under a temporary root, chroot isolation) builds a `FROM scratch` image
//! holding the ferry binary this test suite built and the shared libraries `ldd` lists,
//! running as a non-root user like the top-level Containerfile's image; then `buildah run`
//! runs `ferry --version` and a `ferry copy` between files bind-mounted from the host,
//! whose bytes are checked on the host. Also checks that the top-level Containerfile
//! builds and runs what the service needs (the release `ferry`, the ports it listens on).
//!
//! Nothing here touches the machine's own image store: images and containers live in the
//! test's storage root and go with its temporary directory.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::Instant;

use ferry_server::config::{DEFAULT_GRPC_LISTEN, DEFAULT_METRICS_LISTEN};
use ferry_tests::check::{assert_allocated_about, blkhash_file, qemu_img_compare};
use ferry_tests::service_support::make_image;

const BIN: &str = env!("CARGO_BIN_EXE_ferry-e2e");
const MIB: u64 = 1024 * 1024;
/// The non-root user of the image (distroless's `nonroot`).
const USER: &str = "65532:65532";

/// buildah with its own storage under `root` (also used by golden_image.rs).
pub(crate) struct Buildah {
    pub(crate) root: PathBuf,
}

impl Buildah {
    pub(crate) fn cmd(&self) -> Command {
        let mut cmd = Command::new("buildah");
        cmd.arg("--root")
            .arg(self.root.join("storage"))
            .arg("--runroot")
            .arg(self.root.join("run"))
            .args(["--storage-driver", "vfs"])
            .env("BUILDAH_ISOLATION", "chroot")
            .env("STORAGE_DRIVER", "vfs");
        cmd
    }

    /// Runs `buildah ARGS` and returns its output; fails the test when it fails.
    pub(crate) fn run(&self, args: &[&str]) -> Output {
        let out = self
            .cmd()
            .args(args)
            .output()
            .unwrap_or_else(|e| panic!("cannot run buildah: {e}"));
        assert!(
            out.status.success(),
            "buildah {args:?} failed ({}):\n{}{}",
            out.status,
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        out
    }
}

/// Panics with the install command when buildah is missing.
pub(crate) fn require_buildah() {
    let found = Command::new("buildah").arg("--version").output().is_ok();
    assert!(
        found,
        "buildah is not installed: run `apt-get update && apt-get install -y buildah` \
         (or the project's test command, scripts/test.sh, which installs it)"
    );
}

/// The files `ldd` says the binary loads (the dynamic loader included), by absolute path.
fn shared_libraries(bin: &Path) -> Vec<PathBuf> {
    let out = Command::new("ldd").arg(bin).output().expect("run ldd");
    assert!(out.status.success(), "ldd {}: {out:?}", bin.display());
    let text = String::from_utf8_lossy(&out.stdout);
    let libs: Vec<PathBuf> = text
        .lines()
        .filter_map(|line| {
            // "libc.so.6 => /lib/x86_64-linux-gnu/libc.so.6 (0x...)" or
            // "/lib64/ld-linux-x86-64.so.2 (0x...)"; linux-vdso has no file.
            let path = match line.split_once("=>") {
                Some((_, rest)) => rest.split_whitespace().next()?,
                None => line.split_whitespace().next()?,
            };
            path.starts_with('/').then(|| PathBuf::from(path))
        })
        .collect();
    assert!(
        libs.iter().any(|l| l.to_string_lossy().contains("libc.so")),
        "ldd listed no libc: {text}"
    );
    libs
}

/// A build context: `rootfs/` with `/ferry` and its libraries at their paths, and a
/// Containerfile that puts it in a scratch image.
pub(crate) fn context(dir: &Path) -> u64 {
    let rootfs = dir.join("rootfs");
    std::fs::create_dir_all(&rootfs).unwrap();
    let mut bytes = 0;
    let mut put = |from: &Path, to: &Path| {
        let dest = rootfs.join(to.strip_prefix("/").unwrap_or(to));
        std::fs::create_dir_all(dest.parent().unwrap()).unwrap();
        // Follows symlinks: the image gets the files themselves.
        bytes +=
            std::fs::copy(from, &dest).unwrap_or_else(|e| panic!("copy {}: {e}", from.display()));
    };
    // Without debug info, as the Containerfile's build strips it.
    let stripped = dir.join("ferry.stripped");
    let objcopy = std::process::Command::new("objcopy")
        .args(["--strip-debug", BIN])
        .arg(&stripped)
        .status()
        .expect("run objcopy (apt-get install binutils)");
    assert!(objcopy.success());
    put(&stripped, Path::new("/ferry"));
    for lib in shared_libraries(Path::new(BIN)) {
        put(&lib, &lib);
    }
    std::fs::write(
        dir.join("Containerfile"),
        format!(
            "FROM scratch\nCOPY rootfs/ /\nUSER {USER}\nENTRYPOINT [\"/ferry\"]\nCMD [\"--help\"]\n"
        ),
    )
    .unwrap();
    bytes
}

#[test]
fn scratch_image_runs_ferry_version_and_a_copy_as_non_root() {
    require_buildah();
    let started = Instant::now();
    let tmp = ferry_tests::scratch_dir();
    let buildah = Buildah {
        root: tmp.path().join("buildah"),
    };
    let ctx = tmp.path().join("context");
    let image_bytes = context(&ctx);
    let image = "localhost/ferry-test:latest";
    buildah.run(&[
        "bud",
        "--isolation",
        "chroot",
        "--layers=false",
        "-t",
        image,
        ctx.to_str().unwrap(),
    ]);
    let built = started.elapsed();

    let inspect = buildah.run(&["inspect", "--type", "image", image]);
    let config: serde_json::Value = serde_json::from_slice(&inspect.stdout).unwrap();
    assert_eq!(config["OCIv1"]["config"]["User"], USER, "{config}");
    assert_eq!(
        config["OCIv1"]["config"]["Entrypoint"],
        serde_json::json!(["/ferry"])
    );

    let container = String::from_utf8(buildah.run(&["from", image]).stdout).unwrap();
    let container = container.trim();

    let version = buildah.run(&[
        "run",
        "--isolation",
        "chroot",
        container,
        "--",
        "/ferry",
        "--version",
    ]);
    let version = String::from_utf8_lossy(&version.stdout);
    assert!(
        version.contains(env!("CARGO_PKG_VERSION")),
        "ferry --version printed: {version}"
    );

    // The operator's mover pod: its command, as a container runtime resolves it (no shell,
    // the image's PATH), under the pod's user and group.
    let (command, user) = mover_command_and_user();
    let mut argv = vec![
        "run",
        "--isolation",
        "chroot",
        "--user",
        &user,
        container,
        "--",
    ];
    argv.extend(command.iter().map(String::as_str));
    argv.push("--version");
    let mover = buildah.run(&argv);
    assert!(
        String::from_utf8_lossy(&mover.stdout).contains(env!("CARGO_PKG_VERSION")),
        "the mover's command {command:?} printed: {mover:?}"
    );

    // A copy between files of the host, bind-mounted; the image's user writes the target.
    let data = tmp.path().join("data");
    std::fs::create_dir(&data).unwrap();
    let src = make_image(&data.join("src.img"), 8 * MIB, 11);
    std::fs::set_permissions(&data, std::os::unix::fs::PermissionsExt::from_mode(0o777)).unwrap();
    let mount = format!("{}:/data", data.display());
    buildah.run(&[
        "run",
        "--isolation",
        "chroot",
        "-v",
        &mount,
        container,
        "--",
        "/ferry",
        "copy",
        "/data/src.img",
        "/data/dst.img",
    ]);
    let dst = data.join("dst.img");
    qemu_img_compare(&src, &dst);
    assert_eq!(blkhash_file(&src), blkhash_file(&dst));
    assert_allocated_about(&dst, 4 * MIB);
    let owner = std::os::unix::fs::MetadataExt::uid(&std::fs::metadata(&dst).unwrap());
    assert_eq!(owner, 65532, "the copy ran as the image's non-root user");

    buildah.run(&["rm", container]);
    buildah.run(&["rmi", image]);
    let images = buildah.run(&["images", "-q"]);
    assert!(images.stdout.trim_ascii().is_empty(), "{images:?}");
    // What every node pulls: the stripped binary and its libraries, well under the
    // unstripped binary alone.
    let unstripped = std::fs::metadata(BIN).unwrap().len();
    assert!(
        image_bytes < unstripped * 2 / 3,
        "image of {image_bytes} bytes for a binary of {unstripped} unstripped"
    );
    eprintln!(
        "image of {} MiB (the binary unstripped: {} MiB) built in {built:?}; whole test {:?}",
        image_bytes / MIB,
        unstripped / MIB,
        started.elapsed()
    );
}

/// The top-level Containerfile (it cannot be built here: its base images come from
/// registries) builds the release `ferry`, runs it as non-root on a minimal base, and
/// its service defaults match what `ferry serve` listens on.
#[test]
fn containerfile_builds_the_release_binary_and_exposes_the_service_ports() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let text = std::fs::read_to_string(root.join("Containerfile")).unwrap();
    let lines: Vec<&str> = text
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .collect();
    let froms: Vec<&str> = lines
        .iter()
        .copied()
        .filter(|l| l.starts_with("FROM "))
        .collect();
    assert_eq!(
        froms,
        [
            "FROM docker.io/library/rust:1.95-bookworm AS build",
            "FROM gcr.io/distroless/cc-debian12:nonroot"
        ]
    );
    assert!(text.contains("cargo build --release --locked -p ferry --bin ferry"));
    assert!(
        lines.contains(&"ENV CARGO_PROFILE_RELEASE_STRIP=debuginfo"),
        "the image's binary is built without debug info"
    );
    assert!(lines.contains(&"COPY --from=build /out/ferry /ferry"));
    assert!(lines.contains(&format!("USER {USER}").as_str()));
    assert!(lines.contains(&r#"ENTRYPOINT ["/ferry"]"#));
    let port = |addr: &str| addr.rsplit_once(':').unwrap().1.to_string();
    let grpc = port(DEFAULT_GRPC_LISTEN);
    let metrics = port(DEFAULT_METRICS_LISTEN);
    assert!(
        lines.contains(&format!("EXPOSE {grpc} {metrics}").as_str()),
        "{lines:?}"
    );
    assert!(text.contains(&format!("FERRY_GRPC_LISTEN=0.0.0.0:{grpc}")));
    assert!(text.contains(&format!("FERRY_METRICS_LISTEN=0.0.0.0:{metrics}")));
    // The build context leaves out build outputs and images (both ignore files agree).
    for name in [".containerignore", ".dockerignore"] {
        let ignore = std::fs::read_to_string(root.join(name)).unwrap();
        for entry in ["target", ".git", "**/*.img"] {
            assert!(ignore.lines().any(|l| l == entry), "{name} lacks {entry}");
        }
    }
}

/// The command and `uid:gid` of a Checksum's mover pod with a Block claim, as the operator
/// builds it.
fn mover_command_and_user() -> (Vec<String>, String) {
    use ferry_operator::crd::VolumeMode;

    let (_, _, pod) = ferry_tests::mover_pods::checksum_mover(
        "golden",
        VolumeMode::Block,
        "localhost/ferry-test:latest",
    );
    let spec = pod.spec.unwrap();
    let context = spec.security_context.unwrap();
    let user = format!(
        "{}:{}",
        context.run_as_user.unwrap(),
        context.run_as_group.unwrap()
    );
    (spec.containers[0].command.clone().unwrap(), user)
}

/// The mover pod the operator builds for a Checksum of a Filesystem claim, run in the
/// image as a container runtime would run it: its command and args as given (no shell,
/// no PATH lookup), its user and group, each volumeMount a bind mount of a host directory
/// filled as kubelet would fill it (emptyDirs, the token Secret with the mover's
/// certificate, the claim holding `disk.img`); then the operator's own gRPC link, over
/// mutual TLS with the operator's CA, starts the Checksum's job request on it and follows
/// it to the end. The digest is checked against the image on the host.
#[test]
fn the_operators_mover_pod_runs_in_the_image_and_answers_its_link() {
    use ferry_operator::controller::{
        GrpcMoverLink, JobRequest, JobState, MoverAddress, MoverLink,
    };
    use ferry_operator::crd::VolumeMode;
    use ferry_operator::mover::checksum_request;
    use ferry_operator::mover::tls::MoverCa;
    use std::os::unix::fs::{chown, PermissionsExt};

    require_buildah();
    let tmp = ferry_tests::scratch_dir();
    std::fs::set_permissions(tmp.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let buildah = Buildah {
        root: tmp.path().join("buildah"),
    };
    let ctx = tmp.path().join("context");
    context(&ctx);
    let image = "localhost/ferry-mover-test:latest";
    buildah.run(&[
        "bud",
        "--isolation",
        "chroot",
        "--layers=false",
        "-t",
        image,
        ctx.to_str().unwrap(),
    ]);
    let container = String::from_utf8(buildah.run(&["from", image]).stdout).unwrap();
    let container = container.trim().to_string();

    // The resource and its mover, as the operator makes them.
    let (checksum, pvcs, pod) =
        ferry_tests::mover_pods::checksum_mover("golden", VolumeMode::Filesystem, image);
    let request = checksum_request(&checksum, &pvcs).unwrap();
    let spec = pod.spec.clone().unwrap();
    let security = spec.security_context.clone().unwrap();
    let (uid, gid) = (
        security.run_as_user.unwrap() as u32,
        security.fs_group.or(security.run_as_group).unwrap() as u32,
    );
    let c = &spec.containers[0];

    // kubelet's part: each volume as a directory, owned by the pod's fsGroup.
    let ca = MoverCa::generate().unwrap();
    let issued = ca.issue_mover("sum-fcs-1", "vms").unwrap();
    let token = "0123456789abcdef".repeat(4);
    let bytes: Vec<u8> = (0..(4u32 << 20)).map(|i| (i % 239) as u8).collect();
    let mut mounts = Vec::new();
    for m in c.volume_mounts.iter().flatten() {
        let volume = spec
            .volumes
            .iter()
            .flatten()
            .find(|v| v.name == m.name)
            .unwrap_or_else(|| panic!("no volume {}", m.name));
        let dir = tmp.path().join("volumes").join(&m.name);
        std::fs::create_dir_all(&dir).unwrap();
        if let Some(secret) = &volume.secret {
            for item in secret.items.iter().flatten() {
                let value = match item.key.as_str() {
                    "token" => token.clone(),
                    "tls.crt" => issued.cert_pem.clone(),
                    "tls.key" => issued.key_pem.clone(),
                    "ca.crt" => ca.cert_pem().to_string(),
                    other => panic!("unknown key {other} of the token Secret"),
                };
                let file = dir.join(&item.path);
                std::fs::write(&file, value).unwrap();
                chown(&file, Some(0), Some(gid)).unwrap();
                let mode = secret.default_mode.unwrap_or(0o644) as u32;
                std::fs::set_permissions(&file, std::fs::Permissions::from_mode(mode)).unwrap();
            }
        }
        if let Some(claim) = &volume.persistent_volume_claim {
            assert_eq!(claim.claim_name, "golden");
            std::fs::write(dir.join("disk.img"), &bytes).unwrap();
            chown(dir.join("disk.img"), Some(uid), Some(gid)).unwrap();
        }
        chown(&dir, Some(0), Some(gid)).unwrap();
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o2775)).unwrap();
        let ro = if m.read_only == Some(true) { ":ro" } else { "" };
        mounts.push(format!("{}:{}{ro}", dir.display(), m.mount_path));
    }

    // The container runtime's part: the command and args as given, as the pod's user.
    let user = format!("{uid}:{}", security.run_as_group.unwrap());
    let mut run = buildah.cmd();
    run.args(["run", "--isolation", "chroot", "--user", &user]);
    for m in &mounts {
        run.args(["-v", m]);
    }
    run.arg(&container).arg("--");
    run.args(c.command.clone().unwrap());
    run.args(c.args.clone().unwrap());
    std::os::unix::process::CommandExt::process_group(&mut run, 0);
    let mover = run
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("run the mover");
    let group = mover.id() as i32;
    let stop = scopeguard(move || {
        // SAFETY: signalling the process group this test started.
        unsafe {
            libc::kill(-group, libc::SIGTERM);
        }
    });

    // The operator's part: its link, as in the cluster, to the pod's port.
    let port = u16::try_from(c.ports.as_ref().unwrap()[0].container_port).unwrap();
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let report = runtime.block_on(async {
        let deadline = Instant::now() + std::time::Duration::from_secs(30);
        while tokio::net::TcpStream::connect(("127.0.0.1", port))
            .await
            .is_err()
        {
            assert!(
                Instant::now() < deadline,
                "the mover never listened on {port}"
            );
            tokio::time::sleep(std::time::Duration::from_millis(100)).await;
        }
        let link = GrpcMoverLink::default().with_ca(std::sync::Arc::new(ca));
        let address = MoverAddress {
            namespace: "vms".into(),
            pod: "sum-fcs-1".into(),
            ip: "127.0.0.1".into(),
            port,
            token: token.clone(),
        };
        let job = JobRequest::Checksum(Box::new(request));
        let started = link
            .start(&address, &job)
            .await
            .expect("the mover takes the job");
        let mut stream = link.watch(&address, &started.id).await.unwrap();
        let mut last = started;
        while let Some(report) = futures_util::StreamExt::next(&mut stream).await {
            last = report.unwrap();
            if last.state.is_terminal() {
                break;
            }
        }
        last
    });
    drop(stop);
    let out = mover.wait_with_output().unwrap();
    assert_eq!(
        report.state,
        JobState::Succeeded,
        "{report:?}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let disk = tmp.path().join("volumes").join("pvc-0").join("disk.img");
    assert_eq!(
        report.source_digest.as_deref(),
        Some(format!("blkhash:{}", blkhash_file(&disk)).as_str()),
        "{report:?}"
    );
    buildah.run(&["rm", &container]);
    buildah.run(&["rmi", image]);
}

/// Runs `f` when dropped (also when the test panics).
fn scopeguard(f: impl FnOnce()) -> impl Drop {
    struct Guard<F: FnOnce()>(Option<F>);
    impl<F: FnOnce()> Drop for Guard<F> {
        fn drop(&mut self) {
            if let Some(f) = self.0.take() {
                f();
            }
        }
    }
    Guard(Some(f))
}
