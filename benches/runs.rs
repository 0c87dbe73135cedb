//! Merging runs (list.bin version 2): the real `merger` binary, timed as child processes,
//! on one fixture per shard count (4 and 64; `QLIST_BENCH_SHARDS` picks), with
//! `QLIST_BENCH_ITEMS` items in all (default 10 million) of 100-byte payloads:
//!
//! - `sublists`: `merger --data-dir DIR --out list.bin`, today's path (the baseline);
//! - `runs dir`: `merger --runs RUNSDIR --out list.bin` (goals: at least 1.0x sublists,
//!   0.9x `scan`, 0.6x `cat`);
//! - `runs s3`: `merger --runs s3://bucket/prefix --out list.bin`, the runs in a real
//!   SeaweedFS (`testkit::s3::TestS3`) (goal: at least 0.8x `s3 read`);
//! - `s3 read`: the plain reader of the same objects on the same server, the limit the
//!   S3 merge is measured against: every object fetched whole with ranged GETs of 4 MiB,
//!   32 in flight across the objects, the bytes discarded (this binary as a child);
//! - `runs dir --jobs 2` (goal: at least 1.6x `runs dir`);
//! - `scan`: the one-core baseline, this binary run again as a child: each run read in
//!   turn through the merger's own reader (`merger::runs::RunInput::blocks`: ranged reads,
//!   every block's CRC and framing checked, records borrowed, not copied), its records
//!   framed into blocks by the run's block rule (a CRC per block, an index) and written
//!   through the merger's own output (`qstore`'s upload: background writeback, fsync,
//!   rename); no merging and no order or seq checks;
//! - `cat`: `cat RUNSDIR/*.bin > out && sync out`, a byte copy (a reference, no decoding);
//! - `part i/4`: the K = 4 parts of a split merge as 4 processes, one after another (goal:
//!   a part costs at most 1/K of the whole `runs dir` merge plus one index read per input);
//!   `4 parts, 2 at a time`: the same 4 processes, two running at once;
//! - `parquet`: `merger --runs RUNSDIR --out list.parquet --compression none` (goal: at
//!   least 0.7x `runs dir`), and `parquet snappy` (the default codec); then DuckDB (the venv's, as
//!   the Parquet tests use it) times `count(*)` and a query of 0.1% of the IDs on the
//!   file, and checks the count.
//!
//! `QLIST_BENCH_BATCH=1000` deals the IDs to shards in batches of 1000 consecutive IDs, as
//! producers stamping in batches interleave (default 1: every ID to a random shard).
//!
//! `QLIST_BENCH_ROWS` (comma-separated: sublists, dir, s3, s3read, jobs2, scan, cat, parts,
//! parquet, dirbase, s3base) runs only those rows.
//!
//! `QLIST_BENCH_BASE_MERGER=PATH` adds `dirbase` and `s3base`: the `runs dir` and `runs s3`
//! rows again with another `merger` binary (say, one built from the commit before a
//! change), interleaved with the others, so a change is measured against its baseline in
//! one run.
//!
//! Every row runs `QLIST_BENCH_REPS` times (default 3), the rows interleaved (rep 1 of
//! every row, then rep 2, ...), and reports the median wall time, the best (on a shared
//! VM whose speed moves by 3x within a minute, the least disturbed), MB/s of output (10^6
//! bytes), items/s, the child's CPU seconds in user mode and in the kernel (`wait4`'s
//! `ru_utime`, `ru_stime`: on this VM a row's kernel time moves with the machine, see
//! BENCHMARKS.md), the median peak RSS of the child (`wait4`'s `ru_maxrss`, KiB) and the
//! number of children that exited non-zero (each is reported with the end of its stderr).
//! Children are started through a small `sh` (see [`spawn`]) so that their peak RSS is
//! their own, not this bench's.
//! CPU steal (from /proc/stat, as `vmstat`'s `st`) is sampled around every row and the
//! whole run. Peak-RSS flatness: `runs dir`, `runs s3`, `part 1/4` and `--jobs 2` run
//! again on a fixture of 10% of the items. Prints markdown tables at the end.
//!
//! Fixture: sublists written with the producer's `ShardWriter` (IDs 1..=N dealt to shards
//! at random, seeded), each sealed into `runs/shard-<n>.bin` by `merger --out
//! runs/shard-<n>.bin DIR/shard-<n>` (a merge of one sublist is its seal), then copied to
//! the S3 server with `merger --out s3://.../shard-<n>.bin runs/shard-<n>.bin`. Outputs
//! are checked with `merger verify` after the timed runs. The test server's volumes are
//! raised to hold a 10M-item fixture (see [`WEED_VOLUME_MB`]).
//!
//! Needs the release `merger` binary next to this bench's target dir (`cargo bench` does
//! not build it): `cargo build --release -p merger` first, or `QLIST_MERGER=PATH`; and
//! `weed` (`bash scripts/deps.sh`).
//!
//! ```sh
//! export CARGO_TARGET_DIR=/var/tmp/qlist-target
//! cargo build --release -p merger && cargo bench --bench runs
//! QLIST_BENCH_ITEMS=200000 QLIST_BENCH_REPS=1 cargo bench --bench runs    # smoke test
//! ```
//!
//! The fixture lives under `QLIST_BENCH_DIR` (default: the system temp dir) and is removed
//! at the end (kept with `QLIST_BENCH_KEEP=1`).

use std::collections::BTreeMap;
use std::ffi::OsString;
use std::fs::File;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use qformat::listbin::Crc32;
use qformat::run::{Footer, FOOTER_LEN, HEADER_LEN, MAGIC};
use qformat::shard::ProgressMarker;
use qformat::Record;
use rand::{Rng, SeedableRng};
use sublist::shard::ShardWriter;
use testkit::s3::TestS3;

const DEFAULT_ITEMS: u64 = 10_000_000;
const PAYLOAD: usize = 100;
/// Default shard counts; `QLIST_BENCH_SHARDS=64` (comma-separated) picks others.
const SHARD_COUNTS: [u32; 2] = [4, 64];
/// Items buffered across all shards while building the fixture (as benches/merge.rs).
const BUILD_BUFFER: usize = 256_000;
/// Repetitions of every row; the median is reported.
const DEFAULT_REPS: usize = 3;
/// K of the split merge.
const PARTS: u32 = 4;
/// The part timed on the small fixture for peak-RSS flatness.
const FLAT_PART: u32 = 1;
/// The small fixture holds 1/this of the items.
const SMALL_DIVISOR: u64 = 10;
const BUCKET: &str = "qlist-bench";
/// `testkit::s3::TestS3` caps its server at 8 volumes of 64 MB (small and sparse for
/// tests): about 500 MB, less than one 10M-item fixture (1.3 GB). The bench starts the
/// same server through a wrapper script that appends larger limits (`weed` takes the last
/// value of a repeated flag): 64 volumes of 1 GB, sparse files on the temp dir's disk.
const WEED_VOLUME_MB: u32 = 1024;
const WEED_MAX_VOLUMES: u32 = 64;
/// Set (to the output path) when this binary runs as the `scan` child.
const SCAN_CHILD_ENV: &str = "QLIST_RUNS_BENCH_SCAN_OUT";
/// Set (to the runs' `s3://` prefix) when this binary runs as the `s3 read` child.
const S3_READ_CHILD_ENV: &str = "QLIST_RUNS_BENCH_S3_READ";
/// Ranged GETs the plain S3 reader keeps in flight across all objects, and their size:
/// what a reader that only fetches and discards does at best on this server.
const S3_READ_IN_FLIGHT: usize = 32;
const S3_READ_CHUNK: usize = 4 << 20;
/// Lines of a failed child's stderr shown.
const ERR_TAIL_LINES: usize = 15;

fn payload(id: u64) -> Vec<u8> {
    let mut p = format!("{id:020}-").into_bytes();
    p.resize(PAYLOAD, b'a' + (id % 26) as u8);
    p
}

/// Consecutive IDs dealt to one shard at a time: `QLIST_BENCH_BATCH` (default 1, every
/// ID to a shard of its own draw; 1000 is how producers stamping in batches interleave).
fn batch_len() -> u64 {
    std::env::var("QLIST_BENCH_BATCH")
        .ok()
        .and_then(|v| v.parse().ok())
        .filter(|&b| b > 0)
        .unwrap_or(1)
}

/// Writes `items` items with IDs 1..=items dealt at random (seeded) to `shards` sublists
/// under `data`, as benches/merge.rs does, in batches of [`batch_len`] consecutive IDs.
fn build_sublists(data: &Path, shards: u32, items: u64) {
    let mut writers: Vec<ShardWriter> = (0..shards)
        .map(|s| ShardWriter::open(data, s).expect("open shard writer"))
        .collect();
    let per_shard = (BUILD_BUFFER / shards as usize).max(1);
    let mut buf: Vec<Vec<Record>> = vec![Vec::new(); shards as usize];
    let mut seq = vec![0u64; shards as usize];
    let mut rng = rand::rngs::StdRng::seed_from_u64(42);
    let flush = |w: &mut ShardWriter, b: &mut Vec<Record>, next_seq: u64, finished: bool| {
        let last_id = b
            .last()
            .map(|r| r.id)
            .or_else(|| w.progress().ok().flatten().map(|p| p.last_id))
            .unwrap_or(0);
        let p = ProgressMarker {
            next_seq,
            finished,
            last_id,
            fingerprint: b"bench".to_vec(),
        };
        w.write_batch(b, &p).expect("write batch");
        b.clear();
    };
    let batch = batch_len();
    let mut s = 0usize;
    for id in 1..=items {
        if (id - 1) % batch == 0 {
            s = rng.gen_range(0..shards) as usize;
        }
        buf[s].push(Record {
            id,
            shard: s as u32,
            seq: seq[s],
            payload: payload(id),
        });
        seq[s] += 1;
        if buf[s].len() >= per_shard {
            flush(&mut writers[s], &mut buf[s], seq[s], false);
        }
    }
    for s in 0..shards as usize {
        flush(&mut writers[s], &mut buf[s], seq[s], true);
    }
}

/// One fixture: sublists, the same items sealed as runs in a directory and in S3.
struct Fixture {
    shards: u32,
    items: u64,
    work: PathBuf,
    data: PathBuf,
    runs: PathBuf,
    run_files: Vec<PathBuf>,
    s3_runs: String,
    out: PathBuf,
}

impl Fixture {
    /// The bytes of its runs: what a merge reads, and about what it writes.
    fn run_bytes(&self) -> u64 {
        self.run_files
            .iter()
            .map(|f| std::fs::metadata(f).map_or(0, |m| m.len()))
            .sum()
    }
}

fn build(env: &Env, shards: u32, items: u64) -> Fixture {
    let work = env.root.join(format!("{shards}-shards-{items}"));
    let (data, runs, out) = (work.join("data"), work.join("runs"), work.join("out"));
    for d in [&data, &runs, &out] {
        std::fs::create_dir_all(d).expect("create fixture dir");
    }
    let t = Instant::now();
    build_sublists(&data, shards, items);
    eprintln!(
        "fixture: {items} items in {shards} sublists: {:.1}s",
        t.elapsed().as_secs_f64()
    );
    let t = Instant::now();
    let mut run_files = Vec::new();
    for s in 0..shards {
        let run = runs.join(qformat::names::run_name(s));
        let sublist = qformat::names::shard_db_path(&data, s);
        fixture_step(env, &["--out".into(), run.clone().into(), sublist.into()]);
        run_files.push(run);
    }
    eprintln!(
        "fixture: sealed into {}: {:.1}s",
        runs.display(),
        t.elapsed().as_secs_f64()
    );
    let t = Instant::now();
    let s3_runs = env.s3.url(&format!("{shards}-shards-{items}/runs"));
    for (s, run) in run_files.iter().enumerate() {
        let object = format!("{s3_runs}/{}", qformat::names::run_name(s as u32));
        fixture_step(env, &["--out".into(), object.into(), run.clone().into()]);
    }
    eprintln!(
        "fixture: uploaded to {s3_runs}: {:.1}s",
        t.elapsed().as_secs_f64()
    );
    // Write the fixture back now, untimed: otherwise the first timed rows pay for it
    // (their own writes wait behind gigabytes of the fixture's dirty pages).
    let t = Instant::now();
    let synced = Command::new("sync").status();
    assert!(
        matches!(synced, Ok(s) if s.success()),
        "sync after building the fixture: {synced:?}"
    );
    eprintln!(
        "fixture: written back (sync): {:.1}s",
        t.elapsed().as_secs_f64()
    );
    Fixture {
        shards,
        items,
        work,
        data,
        runs,
        run_files,
        s3_runs,
        out,
    }
}

/// A merger run that builds the fixture: it must succeed.
fn fixture_step(env: &Env, args: &[OsString]) {
    let out = env.merger_command(args).output().expect("run merger");
    assert!(
        out.status.success(),
        "fixture: merger {args:?} failed ({}): {}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
}

/// What the bench needs everywhere: the merger binary, the S3 server, the fixture root.
struct Env {
    merger: PathBuf,
    /// `QLIST_BENCH_BASE_MERGER`: the binary of the baseline rows.
    base_merger: Option<PathBuf>,
    s3: TestS3,
    root: PathBuf,
    reps: usize,
}

impl Env {
    fn merger_command(&self, args: &[OsString]) -> Command {
        self.command_of(&self.merger, args)
    }

    fn command_of(&self, merger: &Path, args: &[OsString]) -> Command {
        let mut cmd = Command::new(merger);
        cmd.args(args).envs(self.s3.env()).stdin(Stdio::null());
        cmd
    }
}

/// The release `merger` next to this bench (target/release/deps/runs-*), or `$QLIST_MERGER`.
fn merger_path() -> PathBuf {
    let path = std::env::var_os("QLIST_MERGER")
        .map(PathBuf::from)
        .or_else(|| {
            let exe = std::env::current_exe().ok()?;
            Some(exe.parent()?.parent()?.join("merger"))
        })
        .expect("cannot locate the merger binary: set QLIST_MERGER");
    checked_merger(path)
}

/// `$QLIST_BENCH_BASE_MERGER`, checked as the merger is.
fn base_merger_path() -> Option<PathBuf> {
    std::env::var_os("QLIST_BENCH_BASE_MERGER").map(|p| checked_merger(PathBuf::from(p)))
}

/// `path`, once it is known to be a merger built without the test hooks.
fn checked_merger(path: PathBuf) -> PathBuf {
    assert!(
        path.is_file(),
        "{} does not exist: build it first with `cargo build --release -p merger` \
         (same CARGO_TARGET_DIR), or set QLIST_MERGER",
        path.display()
    );
    // `cargo test` leaves a build with the test hooks (stall points) in target/release:
    // measuring it would measure the hooks too.
    let version = Command::new(&path)
        .arg("--version")
        .output()
        .expect("run merger --version");
    assert!(
        !String::from_utf8_lossy(&version.stdout).contains("test hooks"),
        "{} is a test build (it has the test hooks): run `cargo build --release --workspace \
         --bins` (same CARGO_TARGET_DIR) to put the release binaries back, or set QLIST_MERGER",
        path.display()
    );
    path
}

/// `$QLIST_WEED`, else `$QLIST_PY/bin/weed` (default /var/tmp/qlist-py), else `weed`:
/// what `testkit::s3` would run.
fn real_weed() -> PathBuf {
    if let Some(w) = std::env::var_os(testkit::s3::WEED_ENV) {
        return PathBuf::from(w);
    }
    let venv = std::env::var_os(testkit::s3::VENV_ENV)
        .map_or_else(|| PathBuf::from(testkit::s3::VENV), PathBuf::from);
    let weed = venv.join("bin/weed");
    if weed.is_file() {
        weed
    } else {
        PathBuf::from("weed")
    }
}

/// Starts the S3 server through a wrapper that raises its volume limits (see
/// [`WEED_VOLUME_MB`]); `exec` keeps the pid, so `TestS3` still kills its own child.
fn start_s3(root: &Path) -> TestS3 {
    let wrapper = root.join("weed-bench.sh");
    let script = format!(
        "#!/bin/sh\nexec '{}' \"$@\" -master.volumeSizeLimitMB={WEED_VOLUME_MB} -volume.max={WEED_MAX_VOLUMES}\n",
        real_weed().display()
    );
    std::fs::write(&wrapper, script).expect("write weed wrapper");
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&wrapper, std::fs::Permissions::from_mode(0o755))
        .expect("chmod weed wrapper");
    // Single-threaded here: nothing else reads the environment concurrently.
    std::env::set_var(testkit::s3::WEED_ENV, &wrapper);
    TestS3::start(BUCKET)
}

/// How one child ended.
struct Exit {
    ok: bool,
    /// Peak RSS in KiB (`ru_maxrss`).
    rss: u64,
    /// CPU seconds in user mode and in the kernel (`ru_utime`, `ru_stime`; children it
    /// waited for included).
    user: f64,
    sys: f64,
}

/// Makes this process the reaper of its orphaned descendants, so [`spawn`] can `wait4`
/// a grandchild.
fn become_subreaper() {
    // SAFETY: prctl with an integer option and integer arguments.
    let rc = unsafe { libc::prctl(libc::PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) };
    assert_eq!(
        rc,
        0,
        "prctl(PR_SET_CHILD_SUBREAPER): {}",
        std::io::Error::last_os_error()
    );
}

/// Starts `cmd` with stdout and stderr into `log` (`.out`, `.err`) and returns its pid.
///
/// Not as our own child: Linux carries the parent's peak RSS into a child's `ru_maxrss`
/// (a forked or vforked child starts with the parent's memory, and `execve` keeps that
/// peak), so every child of this bench would report at least the bench's own RSS (60-80
/// MB). A small `sh` starts it in the background and exits at once; the command is then
/// an orphan reparented to us (we are a subreaper), and `wait4` on it gives its own peak,
/// counted from the shell's ~2 MB. The shell's start (~1-2 ms) is inside the timed span.
fn spawn(cmd: &Command, log: &Path) -> libc::pid_t {
    let mut sh = Command::new("sh");
    sh.arg("-c")
        .arg("\"$@\" </dev/null >\"$QLIST_BENCH_LOG_OUT\" 2>\"$QLIST_BENCH_LOG_ERR\" & echo $!")
        .arg("sh")
        .arg(cmd.get_program())
        .args(cmd.get_args())
        .env("QLIST_BENCH_LOG_OUT", log.with_extension("out"))
        .env("QLIST_BENCH_LOG_ERR", log.with_extension("err"))
        .stdin(Stdio::null())
        .stderr(Stdio::inherit());
    for (k, v) in cmd.get_envs() {
        match v {
            Some(v) => sh.env(k, v),
            None => sh.env_remove(k),
        };
    }
    let out = sh
        .output()
        .unwrap_or_else(|e| panic!("spawn {cmd:?} through sh: {e}"));
    assert!(
        out.status.success(),
        "sh failed to start {cmd:?}: {}",
        out.status
    );
    String::from_utf8_lossy(&out.stdout)
        .trim()
        .parse()
        .unwrap_or_else(|_| panic!("sh did not print a pid for {cmd:?}: {out:?}"))
}

/// Waits for `pid` (started by [`spawn`]) with `wait4`, for its exit status and peak RSS.
fn wait_pid(pid: libc::pid_t) -> Exit {
    let mut status: libc::c_int = 0;
    // SAFETY: rusage is plain data, all zeroes is a valid value.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: wait4 with valid pointers, on a process reparented to us; nothing else
    // in this program waits on it.
    let rc = unsafe { libc::wait4(pid, &mut status, 0, &mut usage) };
    assert_eq!(rc, pid, "wait4({pid}): {}", std::io::Error::last_os_error());
    Exit {
        ok: libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0,
        rss: u64::try_from(usage.ru_maxrss).unwrap_or(0),
        user: seconds(usage.ru_utime),
        sys: seconds(usage.ru_stime),
    }
}

fn seconds(t: libc::timeval) -> f64 {
    t.tv_sec as f64 + t.tv_usec as f64 / 1e6
}

fn report_failure(what: &str, log: &Path) {
    let err = std::fs::read_to_string(log.with_extension("err")).unwrap_or_default();
    let lines: Vec<&str> = err.lines().collect();
    eprintln!(
        "FAILED: {what} (exit non-zero); end of its stderr ({}):\n{}",
        log.with_extension("err").display(),
        lines[lines.len().saturating_sub(ERR_TAIL_LINES)..].join("\n")
    );
}

/// CPU time counters of /proc/stat's `cpu` line, in ticks.
#[derive(Clone, Copy, Default)]
struct Cpu {
    total: u64,
    idle: u64,
    steal: u64,
}

impl Cpu {
    fn now() -> Cpu {
        let stat = std::fs::read_to_string("/proc/stat").unwrap_or_default();
        let f: Vec<u64> = stat
            .lines()
            .next()
            .unwrap_or("")
            .split_whitespace()
            .skip(1)
            .take(8) // user nice system idle iowait irq softirq steal (guest is in user)
            .filter_map(|v| v.parse().ok())
            .collect();
        if f.len() < 8 {
            return Cpu::default();
        }
        Cpu {
            total: f.iter().sum(),
            idle: f[3] + f[4],
            steal: f[7],
        }
    }

    fn since(self, before: Cpu) -> Cpu {
        Cpu {
            total: self.total.saturating_sub(before.total),
            idle: self.idle.saturating_sub(before.idle),
            steal: self.steal.saturating_sub(before.steal),
        }
    }

    fn add(&mut self, d: Cpu) {
        self.total += d.total;
        self.idle += d.idle;
        self.steal += d.steal;
    }

    /// Steal and busy (non-idle, steal included) as percentages of all CPU time.
    fn percent(self) -> (f64, f64) {
        let t = self.total.max(1) as f64;
        (
            100.0 * self.steal as f64 / t,
            100.0 * (self.total - self.idle) as f64 / t,
        )
    }
}

fn load_average() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .unwrap_or_default()
        .split_whitespace()
        .take(3)
        .collect::<Vec<_>>()
        .join(" ")
}

/// The rows timed on every fixture, in this order within a repetition.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Debug)]
enum Row {
    Sublists,
    RunsDir,
    RunsS3,
    S3Read,
    Jobs2,
    Scan,
    Cat,
    Part(u32),
    PartsTwoAtATime,
    Parquet,
    ParquetSnappy,
    /// `runs dir` with `QLIST_BENCH_BASE_MERGER`.
    RunsDirBase,
    /// `runs s3` with `QLIST_BENCH_BASE_MERGER`.
    RunsS3Base,
}

impl Row {
    fn name(self) -> String {
        match self {
            Row::Sublists => "sublists (--data-dir)".into(),
            Row::RunsDir => "runs dir (--runs DIR)".into(),
            Row::RunsS3 => "runs s3 (--runs s3://)".into(),
            Row::S3Read => format!("s3 read ({S3_READ_IN_FLIGHT} GETs in flight, discard)"),
            Row::Jobs2 => "runs dir --jobs 2".into(),
            Row::Scan => "scan (1 core, blocks read and framed)".into(),
            Row::Cat => "cat runs/*.bin + sync".into(),
            Row::Part(i) => format!("part {i}/{PARTS} (alone)"),
            Row::PartsTwoAtATime => format!("{PARTS} parts, 2 at a time"),
            Row::Parquet => "parquet, no compression".into(),
            Row::ParquetSnappy => "parquet snappy".into(),
            Row::RunsDirBase => "runs dir, baseline merger".into(),
            Row::RunsS3Base => "runs s3, baseline merger".into(),
        }
    }

    /// Its name in `QLIST_BENCH_ROWS`.
    fn key(self) -> &'static str {
        match self {
            Row::Sublists => "sublists",
            Row::RunsDir => "dir",
            Row::RunsS3 => "s3",
            Row::S3Read => "s3read",
            Row::Jobs2 => "jobs2",
            Row::Scan => "scan",
            Row::Cat => "cat",
            Row::Part(_) | Row::PartsTwoAtATime => "parts",
            Row::Parquet | Row::ParquetSnappy => "parquet",
            Row::RunsDirBase => "dirbase",
            Row::RunsS3Base => "s3base",
        }
    }

    /// Whether `QLIST_BENCH_ROWS` (if set) selects it.
    fn selected(self) -> bool {
        std::env::var("QLIST_BENCH_ROWS")
            .map_or(true, |v| v.split(',').any(|k| k.trim() == self.key()))
    }

    fn all() -> Vec<Row> {
        let mut rows = vec![
            Row::Sublists,
            Row::RunsDir,
            Row::RunsS3,
            Row::S3Read,
            Row::Jobs2,
            Row::Scan,
            Row::Cat,
        ];
        rows.extend((0..PARTS).map(Row::Part));
        rows.extend([Row::PartsTwoAtATime, Row::Parquet, Row::ParquetSnappy]);
        if std::env::var_os("QLIST_BENCH_BASE_MERGER").is_some() {
            rows.extend([Row::RunsDirBase, Row::RunsS3Base]);
        }
        rows.retain(|r| r.selected());
        rows
    }

    /// The rows re-run on the small fixture (peak-RSS flatness).
    fn flat() -> Vec<Row> {
        let mut rows = vec![
            Row::RunsDir,
            Row::RunsS3,
            Row::Part(FLAT_PART),
            Row::Jobs2,
            Row::Parquet,
        ];
        rows.retain(|r| r.selected());
        rows
    }
}

/// What the repetitions of one row measured.
#[derive(Default)]
struct Measured {
    walls: Vec<Duration>,
    rss: Vec<u64>,
    /// The process's CPU seconds in user mode and in the kernel, per repetition.
    user: Vec<f64>,
    sys: Vec<f64>,
    failures: u32,
    /// Output bytes and items of the last successful repetition.
    bytes: u64,
    items: u64,
    cpu: Cpu,
}

impl Measured {
    fn wall(&self) -> Option<f64> {
        median_f64(self.walls.iter().map(Duration::as_secs_f64).collect())
    }

    /// The shortest wall: the repetition the machine disturbed least.
    fn best(&self) -> Option<f64> {
        self.walls
            .iter()
            .map(Duration::as_secs_f64)
            .min_by(f64::total_cmp)
    }

    fn rss(&self) -> Option<u64> {
        let mut v = self.rss.clone();
        v.sort_unstable();
        v.get(v.len() / 2).copied()
    }
}

fn median_f64(mut v: Vec<f64>) -> Option<f64> {
    v.sort_by(f64::total_cmp);
    v.get(v.len() / 2).copied()
}

/// One or more processes started together, waited for together.
struct Proc {
    cmd: Command,
    log: PathBuf,
    /// The output file, for its size and record count.
    out: PathBuf,
    /// Items it holds when it is not a run (scan, cat); else read from its footer.
    items: Option<u64>,
    /// Bytes it stands for when its output is not what it moved (the s3 read's marker).
    bytes: Option<u64>,
}

impl Fixture {
    fn merger(&self, env: &Env, row: &str, rep: usize, args: Vec<OsString>, out: &str) -> Proc {
        self.merger_of(env, &env.merger, row, rep, args, out)
    }

    /// [`Fixture::merger`] with the binary `merger` (the baseline rows').
    fn merger_of(
        &self,
        env: &Env,
        merger: &Path,
        row: &str,
        rep: usize,
        args: Vec<OsString>,
        out: &str,
    ) -> Proc {
        let out = self.out.join(out);
        let mut all = args;
        all.extend(["--out".into(), out.clone().into()]);
        Proc {
            cmd: env.command_of(merger, &all),
            log: self.out.join(format!("{row}-{rep}.log")),
            out,
            items: None,
            bytes: None,
        }
    }

    /// The process groups of `row`: each group's processes run at once, groups one after another.
    fn procs(&self, env: &Env, row: Row, rep: usize) -> Vec<Vec<Proc>> {
        let runs: OsString = self.runs.clone().into();
        let part = |i: u32, prefix: &str| {
            let part = format!("{i}/{PARTS}");
            let args = vec!["--runs".into(), runs.clone(), "--part".into(), part.into()];
            let (row, out) = (format!("{prefix}part{i}"), format!("{prefix}part-{i}.bin"));
            self.merger(env, &row, rep, args, &out)
        };
        match row {
            Row::Sublists => {
                let args = vec!["--data-dir".into(), self.data.clone().into()];
                vec![vec![self.merger(
                    env,
                    "sublists",
                    rep,
                    args,
                    "list-sublists.bin",
                )]]
            }
            Row::RunsDir => {
                let args = vec!["--runs".into(), runs];
                vec![vec![self.merger(env, "dir", rep, args, "list-dir.bin")]]
            }
            Row::RunsS3 => {
                let args = vec!["--runs".into(), self.s3_runs.clone().into()];
                vec![vec![self.merger(env, "s3", rep, args, "list-s3.bin")]]
            }
            Row::RunsDirBase | Row::RunsS3Base => {
                let (from, name): (OsString, _) = if row == Row::RunsDirBase {
                    (runs, "dirbase")
                } else {
                    (self.s3_runs.clone().into(), "s3base")
                };
                let args = vec!["--runs".into(), from];
                let out = format!("list-{name}.bin");
                let base = env.base_merger.as_ref().expect("QLIST_BENCH_BASE_MERGER");
                vec![vec![self.merger_of(env, base, name, rep, args, &out)]]
            }
            Row::Jobs2 => {
                let args = vec!["--runs".into(), runs, "--jobs".into(), "2".into()];
                vec![vec![self.merger(env, "jobs2", rep, args, "list-jobs2.bin")]]
            }
            Row::Scan => vec![vec![self.scan_proc(rep)]],
            Row::S3Read => vec![vec![self.s3_read_proc(env, rep)]],
            Row::Cat => vec![vec![self.cat_proc(rep)]],
            Row::Part(i) => vec![vec![part(i, "")]],
            Row::PartsTwoAtATime => (0..PARTS)
                .collect::<Vec<_>>()
                .chunks(2)
                .map(|c| c.iter().map(|&i| part(i, "pair-")).collect())
                .collect(),
            Row::Parquet | Row::ParquetSnappy => {
                let (name, codec) = if row == Row::Parquet {
                    ("parquet", "none")
                } else {
                    ("parquet-snappy", "snappy")
                };
                let args = vec!["--runs".into(), runs, "--compression".into(), codec.into()];
                let mut p = self.merger(env, name, rep, args, &format!("list-{name}.parquet"));
                // Not a run: no footer to count its records by (the readers check it).
                p.items = Some(self.items);
                vec![vec![p]]
            }
        }
    }

    fn scan_proc(&self, rep: usize) -> Proc {
        let out = self.out.join("scan.bin");
        let mut cmd = Command::new(std::env::current_exe().expect("current exe"));
        cmd.env(SCAN_CHILD_ENV, &out)
            .args(&self.run_files)
            .stdin(Stdio::null());
        Proc {
            cmd,
            log: self.out.join(format!("scan-{rep}.log")),
            out,
            items: Some(self.items),
            bytes: None,
        }
    }

    fn s3_read_proc(&self, env: &Env, rep: usize) -> Proc {
        let out = self.out.join("s3-read.txt");
        let mut cmd = Command::new(std::env::current_exe().expect("current exe"));
        cmd.env(S3_READ_CHILD_ENV, &self.s3_runs)
            .arg(&out)
            .envs(env.s3.env())
            .stdin(Stdio::null());
        let runs_bytes = self.run_bytes();
        Proc {
            cmd,
            log: self.out.join(format!("s3read-{rep}.log")),
            out,
            items: Some(self.items),
            bytes: Some(runs_bytes),
        }
    }

    fn cat_proc(&self, rep: usize) -> Proc {
        let out = self.out.join("cat.bin");
        let mut cmd = Command::new("sh");
        cmd.arg("-c")
            .arg("out=$1; shift; cat \"$@\" > \"$out\" && sync \"$out\"")
            .arg("sh")
            .arg(&out)
            .args(&self.run_files)
            .stdin(Stdio::null());
        Proc {
            cmd,
            log: self.out.join(format!("cat-{rep}.log")),
            out,
            items: Some(self.items),
            bytes: None,
        }
    }
}

/// The plain reader (the `s3 read` row): every object under `prefix` fetched whole with
/// ranged GETs of [`S3_READ_CHUNK`] bytes, [`S3_READ_IN_FLIGHT`] in flight across all of
/// them (each object's reads in order, the objects read at once), the bytes discarded.
/// Returns the bytes read.
fn s3_read_child(prefix: &str) -> u64 {
    let objects_at = qstore::Location::parse(prefix).expect("prefix");
    let probe = qstore::Store::new(qstore::StoreOptions::default());
    let objects = probe.list_runs(&objects_at).expect("list");
    let per_object = (S3_READ_IN_FLIGHT / objects.len().max(1)).max(1);
    let store = qstore::Store::new(qstore::StoreOptions {
        read_chunk: S3_READ_CHUNK,
        in_flight: per_object,
        ..qstore::StoreOptions::default()
    });
    let total = std::sync::atomic::AtomicU64::new(0);
    // One thread per object (at most in-flight of them at once), each draining its reads.
    for group in objects.chunks(S3_READ_IN_FLIGHT.max(1)) {
        std::thread::scope(|scope| {
            for loc in group {
                let (store, total) = (&store, &total);
                scope.spawn(move || {
                    let object = store.open(loc).expect("open");
                    let mut n = 0u64;
                    let whole = std::iter::once(0..object.len()).collect();
                    for piece in object.read_ranges(whole) {
                        n += piece.expect("read").1.len() as u64;
                    }
                    total.fetch_add(n, std::sync::atomic::Ordering::Relaxed);
                });
            }
        });
    }
    total.into_inner()
}

/// Records in a run's footer, or `None` (not a run: the scan and cat outputs).
fn run_records(path: &Path) -> Option<u64> {
    use std::io::{Read, Seek, SeekFrom};
    let mut f = File::open(path).ok()?;
    let len = f.metadata().ok()?.len();
    let mut footer = [0u8; FOOTER_LEN as usize];
    f.seek(SeekFrom::Start(len.checked_sub(FOOTER_LEN)?)).ok()?;
    f.read_exact(&mut footer).ok()?;
    Footer::decode(&footer, len).ok().map(|f| f.records)
}

/// Runs one repetition of `row`, adding to `m`.
fn run_row(env: &Env, f: &Fixture, row: Row, rep: usize, m: &mut Measured) {
    let groups = f.procs(env, row, rep);
    let cpu = Cpu::now();
    let start = Instant::now();
    let (mut ok, mut rss, mut bytes, mut items) = (true, 0u64, 0u64, 0u64);
    let (mut user, mut sys) = (0.0, 0.0);
    for group in groups {
        let children: Vec<(libc::pid_t, Proc)> = group
            .into_iter()
            .map(|p| (spawn(&p.cmd, &p.log), p))
            .collect();
        for (
            pid,
            Proc {
                log,
                out,
                items: fixed_items,
                bytes: fixed_bytes,
                ..
            },
        ) in children
        {
            let exit = wait_pid(pid);
            rss = rss.max(exit.rss);
            (user, sys) = (user + exit.user, sys + exit.sys);
            if exit.ok {
                bytes +=
                    fixed_bytes.unwrap_or_else(|| std::fs::metadata(&out).map_or(0, |m| m.len()));
                items += fixed_items.or_else(|| run_records(&out)).unwrap_or(0);
            } else {
                ok = false;
                m.failures += 1;
                let what = format!("{} shards, {}, rep {rep}", f.shards, row.name());
                report_failure(&what, &log);
            }
        }
    }
    let wall = start.elapsed();
    m.cpu.add(Cpu::now().since(cpu));
    if ok {
        m.walls.push(wall);
        m.rss.push(rss);
        m.user.push(user);
        m.sys.push(sys);
        m.bytes = bytes;
        m.items = items;
    }
    eprintln!(
        "  {} shards, {} items, rep {rep}: {:<34} {:>7.2}s  CPU {user:.2} + {sys:.2}s  peak RSS {rss} KiB{}",
        f.shards,
        f.items,
        row.name(),
        wall.as_secs_f64(),
        if ok { "" } else { "  FAILED" }
    );
}

/// Every row of `rows`, `env.reps` times, interleaved.
fn measure(env: &Env, f: &Fixture, rows: &[Row]) -> BTreeMap<Row, Measured> {
    let mut out: BTreeMap<Row, Measured> = BTreeMap::new();
    for rep in 0..env.reps {
        for &row in rows {
            run_row(env, f, row, rep, out.entry(row).or_default());
        }
    }
    out
}

/// `merger verify` on every merger output of the last repetition (untimed); returns
/// the number of failures.
fn verify_outputs(env: &Env, f: &Fixture, rows: &[Row]) -> u32 {
    let mut checks: Vec<Vec<PathBuf>> = Vec::new();
    for name in [
        "list-sublists.bin",
        "list-dir.bin",
        "list-s3.bin",
        "list-jobs2.bin",
    ] {
        checks.push(vec![f.out.join(name)]);
    }
    if rows.contains(&Row::PartsTwoAtATime) {
        for prefix in ["", "pair-"] {
            checks.push(
                (0..PARTS)
                    .map(|i| f.out.join(format!("{prefix}part-{i}.bin")))
                    .collect(),
            );
        }
    }
    let mut failures = 0;
    for files in checks.into_iter().filter(|c| c.iter().all(|p| p.exists())) {
        let mut args: Vec<OsString> = vec!["verify".into()];
        args.extend(files.iter().map(|p| p.clone().into_os_string()));
        let out = env
            .merger_command(&args)
            .output()
            .expect("run merger verify");
        let text = String::from_utf8_lossy(if out.status.success() {
            &out.stdout
        } else {
            &out.stderr
        });
        eprintln!("  verify {}: {}", files[0].display(), text.trim());
        if !out.status.success() {
            failures += 1;
        }
    }
    failures
}

/// Results of one shard count.
struct ShardResult {
    shards: u32,
    items: u64,
    small_items: u64,
    full: BTreeMap<Row, Measured>,
    small: BTreeMap<Row, Measured>,
    verify_failures: u32,
    readers: Vec<ReaderResult>,
}

/// DuckDB on one Parquet output: its size and two queries' median times.
struct ReaderResult {
    file: String,
    bytes: u64,
    /// `count(*)`: seconds, and whether the count was the fixture's.
    count: Option<(f64, bool)>,
    /// The rows of 0.1% of the IDs: seconds and rows.
    range: Option<(f64, u64)>,
}

/// Times DuckDB's `count(*)` and a range query on each Parquet output (median of
/// `env.reps`), checking the count; a reader that fails is reported and counted.
fn read_parquet_outputs(env: &Env, f: &Fixture) -> Vec<ReaderResult> {
    const SCRIPT: &str = r#"
import duckdb, json, sys, time
path, lo, hi, reps = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
def timed(sql, *args):
    times, rows = [], None
    for _ in range(reps):
        con = duckdb.connect()
        t = time.perf_counter()
        rows = con.execute(sql, [path, *args]).fetchall()
        times.append(time.perf_counter() - t)
        con.close()
    times.sort()
    return times[len(times) // 2], rows
c, count = timed("SELECT count(*) FROM read_parquet(?)")
r, rng = timed("SELECT count(*), sum(octet_length(payload)) FROM read_parquet(?) WHERE id BETWEEN ? AND ?", lo, hi)
print(json.dumps({"count_s": c, "count": count[0][0], "range_s": r, "range_rows": rng[0][0]}))
"#;
    let venv = std::env::var_os(testkit::s3::VENV_ENV)
        .map_or_else(|| PathBuf::from(testkit::s3::VENV), PathBuf::from);
    let lo = f.items / 2;
    let hi = lo + f.items / 1000;
    let mut out = Vec::new();
    for name in ["list-parquet.parquet", "list-parquet-snappy.parquet"] {
        let path = f.out.join(name);
        let Ok(meta) = std::fs::metadata(&path) else {
            continue;
        };
        let mut result = ReaderResult {
            file: name.into(),
            bytes: meta.len(),
            count: None,
            range: None,
        };
        let run = Command::new(venv.join("bin/python"))
            .args(["-c", SCRIPT])
            .arg(&path)
            .args([lo.to_string(), hi.to_string(), env.reps.to_string()])
            .output();
        match run {
            Ok(o) if o.status.success() => {
                let v: serde_json::Value =
                    serde_json::from_slice(&o.stdout).unwrap_or(serde_json::Value::Null);
                let n = v["count"].as_u64();
                result.count = v["count_s"].as_f64().map(|s| (s, n == Some(f.items)));
                result.range = v["range_s"].as_f64().zip(v["range_rows"].as_u64());
                eprintln!(
                    "  duckdb on {name}: {}",
                    String::from_utf8_lossy(&o.stdout).trim()
                );
            }
            Ok(o) => eprintln!(
                "FAILED: duckdb on {name}: {}",
                String::from_utf8_lossy(&o.stderr)
            ),
            Err(e) => eprintln!("FAILED: duckdb on {name}: {e} (bash scripts/deps.sh)"),
        }
        out.push(result);
    }
    out
}

fn remove(env_keep: bool, f: &Fixture) {
    if env_keep {
        eprintln!("fixture kept: {}", f.work.display());
    } else {
        let _ = std::fs::remove_dir_all(&f.work);
    }
}

fn bench_shards(env: &Env, shards: u32, items: u64, keep: bool) -> ShardResult {
    let f = build(env, shards, items);
    let full = measure(env, &f, &Row::all());
    let mut verify_failures = verify_outputs(env, &f, &Row::all());
    let readers = read_parquet_outputs(env, &f);
    remove(keep, &f);
    let small_items = (items / SMALL_DIVISOR).max(1);
    let s = build(env, shards, small_items);
    let small = measure(env, &s, &Row::flat());
    verify_failures += verify_outputs(env, &s, &Row::flat());
    remove(keep, &s);
    ShardResult {
        shards,
        items,
        small_items,
        full,
        small,
        verify_failures,
        readers,
    }
}

/// The `scan` child: every run in turn, read and checked as the merger reads it, its
/// records framed as `RunWriter` frames them (blocks by the run's block rule with a CRC
/// each, an index, a footer-sized tail), written, fsynced and renamed as the merger's
/// output is. The records are in shard order, not ID order, so
/// the file is not a valid run; what is timed is the same work per byte, minus merging.
fn scan_child(out: &Path, runs: &[PathBuf]) -> u64 {
    let store = qstore::Store::new(merger::runs::read_options(
        qstore::StoreOptions::default(),
        runs.len(),
        1,
        false,
    ));
    let out = qstore::Location::Dir(out.to_path_buf());
    let mut w = store.create(&out).expect("create scan output");
    w.write_all(&MAGIC).expect("write");
    let mut blocks = BlockSink::default();
    for path in runs {
        let run =
            merger::runs::open_run(&store, &qstore::Location::Dir(path.clone())).expect("open run");
        let mut input = run.blocks(0, u64::MAX);
        while let Some(body) = input.next_block().expect("read run") {
            blocks.push_encoded(&body, &mut w);
        }
    }
    let count = blocks.records;
    blocks.finish(&mut w);
    w.finish().expect("fsync and rename");
    count
}

/// The block framing of a run, without its checks.
#[derive(Default)]
struct BlockSink {
    block: Vec<u8>,
    block_records: u32,
    first: u64,
    last: u64,
    offset: u64,
    index: Vec<u8>,
    records: u64,
    /// Record bytes so far (the block rule's position).
    position: u64,
}

impl BlockSink {
    /// A checked block's records, framed into blocks as a run's (the same block rule
    /// as `RunWriter`, counted from this output's start), no other check.
    fn push_encoded(&mut self, records: &[u8], w: &mut impl Write) {
        let (mut copied, mut pos) = (0, 0);
        for r in qformat::run::BlockRecords::new(records) {
            if self.block.is_empty() && copied == pos {
                self.first = r.id;
            }
            pos += r.encoded.len();
            self.last = r.id;
            self.block_records += 1;
            self.records += 1;
            self.position += r.encoded.len() as u64;
            if self.position >= qformat::run::next_boundary(self.position - r.encoded.len() as u64)
            {
                self.block.extend_from_slice(&records[copied..pos]);
                copied = pos;
                self.flush(w);
            }
        }
        self.block.extend_from_slice(&records[copied..pos]);
    }

    fn flush(&mut self, w: &mut impl Write) {
        if self.block.is_empty() {
            return;
        }
        let offset = HEADER_LEN + self.offset;
        let mut crc = Crc32::new();
        crc.update(&self.block);
        w.write_all(&self.block).expect("write");
        w.write_all(&crc.finalize().to_le_bytes()).expect("write");
        let len = self.block.len() as u32 + 4;
        for v in [self.first, self.last, offset] {
            self.index.extend_from_slice(&v.to_le_bytes());
        }
        self.index
            .extend_from_slice(&self.block_records.to_le_bytes());
        self.index.extend_from_slice(&len.to_le_bytes());
        self.offset += u64::from(len);
        self.block.clear();
        self.block_records = 0;
    }

    fn finish(mut self, w: &mut impl Write) {
        self.flush(w);
        w.write_all(&self.index).expect("write");
        w.write_all(&[0u8; FOOTER_LEN as usize]).expect("write");
    }
}

fn fmt_int(v: f64) -> String {
    let s = format!("{:.0}", v);
    let mut out = String::new();
    for (i, c) in s.chars().enumerate() {
        if i > 0 && (s.len() - i) % 3 == 0 {
            out.push(',');
        }
        out.push(c);
    }
    out
}

fn print_rows(results: &[ShardResult]) {
    println!("\n| shards | items | row | wall s (median) | best s | MB/s | items/s | CPU user + sys s (medians) | peak RSS KiB | failures | steal % | busy % |");
    println!("|--:|--:|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|");
    for r in results {
        for (items, map) in [(r.items, &r.full), (r.small_items, &r.small)] {
            for (row, m) in map {
                let (steal, busy) = m.cpu.percent();
                let (wall, mbs, ips) = match m.wall() {
                    Some(w) => (
                        format!("{w:.2}"),
                        format!("{:.1}", m.bytes as f64 / 1e6 / w),
                        fmt_int(m.items as f64 / w),
                    ),
                    None => ("-".into(), "-".into(), "-".into()),
                };
                let rss = m.rss().map_or("-".into(), |v| fmt_int(v as f64));
                let best = m.best().map_or("-".into(), |b| format!("{b:.2}"));
                let cpu = match (median_f64(m.user.clone()), median_f64(m.sys.clone())) {
                    (Some(u), Some(s)) => format!("{u:.2} + {s:.2}"),
                    _ => "-".into(),
                };
                println!(
                    "| {} | {} | {} | {wall} | {best} | {mbs} | {ips} | {cpu} | {rss} | {} | {steal:.1} | {busy:.0} |",
                    r.shards,
                    fmt_int(items as f64),
                    row.name(),
                    m.failures
                );
            }
        }
    }
}

/// A goal: `value` must be at least (or at most) `goal`.
fn goal_line(shards: u32, what: &str, value: Option<f64>, goal: f64, at_least: bool) {
    let (v, met) = match value {
        Some(v) => (
            format!("{v:.2}"),
            if (at_least && v >= goal) || (!at_least && v <= goal) {
                "met"
            } else {
                "NOT met"
            },
        ),
        None => ("-".into(), "no data"),
    };
    let op = if at_least { ">=" } else { "<=" };
    println!("| {shards} | {what} | {v} | {op} {goal} | {met} |");
}

/// The ratios and goals, from each row's median (`pick` = [`Measured::wall`]) or its best
/// repetition ([`Measured::best`]).
fn print_ratios(results: &[ShardResult], pick: fn(&Measured) -> Option<f64>, from: &str) {
    println!("\n| shards | ratio (from {from}, same run) | value | goal | |");
    println!("|--:|---|--:|--:|---|");
    for r in results {
        let w = |row: Row| r.full.get(&row).and_then(pick);
        let speed = |a: Row, b: Row| Some(w(b)? / w(a)?);
        let (dir, s) = (Row::RunsDir, r.shards);
        goal_line(
            s,
            "runs dir / sublists (throughput)",
            speed(dir, Row::Sublists),
            1.0,
            true,
        );
        goal_line(
            s,
            "runs dir / scan (one job against the one-core scan)",
            speed(dir, Row::Scan),
            0.9,
            true,
        );
        goal_line(s, "runs dir / cat + sync", speed(dir, Row::Cat), 0.6, true);
        goal_line(
            s,
            "runs s3 / plain s3 reader (throughput)",
            speed(Row::RunsS3, Row::S3Read),
            0.8,
            true,
        );
        goal_line(
            s,
            "runs s3 / runs dir (throughput)",
            speed(Row::RunsS3, dir),
            0.8,
            true,
        );
        let parts: Option<Vec<f64>> = (0..PARTS).map(|i| w(Row::Part(i))).collect();
        let whole = w(dir);
        let k = f64::from(PARTS);
        if let (Some(parts), Some(whole)) = (parts, whole) {
            let max = parts.iter().copied().fold(0.0, f64::max);
            let sum: f64 = parts.iter().sum();
            goal_line(
                s,
                "slowest part / (whole / K)",
                Some(max / (whole / k)),
                1.0,
                false,
            );
            goal_line(s, "sum of K parts / whole", Some(sum / whole), 1.0, false);
        }
        goal_line(
            s,
            "parquet / runs dir (throughput)",
            speed(Row::Parquet, dir),
            0.7,
            true,
        );
        let pair = w(Row::PartsTwoAtATime);
        goal_line(
            s,
            "whole / K parts 2 at a time (speed-up)",
            whole.zip(pair).map(|(a, b)| a / b),
            1.0,
            true,
        );
        goal_line(
            s,
            "--jobs 2 / runs dir (speed-up)",
            speed(Row::Jobs2, dir),
            1.6,
            true,
        );
        for (row, base) in [(dir, Row::RunsDirBase), (Row::RunsS3, Row::RunsS3Base)] {
            if let Some(v) = speed(row, base) {
                println!(
                    "| {s} | {} / the baseline merger's | {v:.2} | | |",
                    row.name()
                );
            }
        }
    }
}

fn print_flatness(results: &[ShardResult]) {
    println!(
        "\n| shards | row | peak RSS KiB, {}% of items | peak RSS KiB, 100% | 100% / 10% |",
        100 / SMALL_DIVISOR
    );
    println!("|--:|---|--:|--:|--:|");
    for r in results {
        for row in Row::flat() {
            let small = r.small.get(&row).and_then(Measured::rss);
            let full = r.full.get(&row).and_then(Measured::rss);
            let ratio = small
                .zip(full)
                .map_or("-".into(), |(a, b)| format!("{:.2}", b as f64 / a as f64));
            let k = |v: Option<u64>| v.map_or("-".into(), |v| fmt_int(v as f64));
            println!(
                "| {} | {} | {} | {} | {ratio} |",
                r.shards,
                row.name(),
                k(small),
                k(full)
            );
        }
    }
}

fn print_readers(results: &[ShardResult]) {
    println!(
        "\n| shards | file | MB | DuckDB count(*) s | count right | DuckDB 0.1% of ids s | rows |"
    );
    println!("|--:|---|--:|--:|---|--:|--:|");
    for r in results {
        for x in &r.readers {
            let (cs, right) = x.count.map_or(("FAILED".into(), "-"), |(s, ok)| {
                (format!("{s:.3}"), if ok { "yes" } else { "NO" })
            });
            let (rs, rows) = x.range.map_or(("FAILED".into(), "-".into()), |(s, n)| {
                (format!("{s:.3}"), fmt_int(n as f64))
            });
            println!(
                "| {} | {} | {:.1} | {cs} | {right} | {rs} | {rows} |",
                r.shards,
                x.file,
                x.bytes as f64 / 1e6
            );
        }
    }
}

fn env_or<T: std::str::FromStr>(name: &str, default: T) -> T {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn shard_counts() -> Vec<u32> {
    match std::env::var("QLIST_BENCH_SHARDS") {
        Ok(v) => v
            .split(',')
            .map(|s| {
                s.trim()
                    .parse()
                    .expect("QLIST_BENCH_SHARDS: comma-separated numbers")
            })
            .collect(),
        Err(_) => SHARD_COUNTS.to_vec(),
    }
}

fn main() {
    if let Some(prefix) = std::env::var_os(S3_READ_CHILD_ENV) {
        let out: PathBuf = std::env::args_os().nth(1).map(PathBuf::from).expect("out");
        let n = s3_read_child(&prefix.to_string_lossy());
        // The bytes read, so the row's MB/s is of what crossed the wire.
        std::fs::write(&out, vec![0u8; 0]).expect("write marker");
        println!("read {n} bytes");
        return;
    }
    if let Some(out) = std::env::var_os(SCAN_CHILD_ENV) {
        let runs: Vec<PathBuf> = std::env::args_os().skip(1).map(PathBuf::from).collect();
        let n = scan_child(Path::new(&out), &runs);
        println!("scanned {n} records");
        return;
    }
    let items: u64 = env_or("QLIST_BENCH_ITEMS", DEFAULT_ITEMS);
    let keep = std::env::var_os("QLIST_BENCH_KEEP").is_some();
    let root_parent = std::env::var_os("QLIST_BENCH_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(std::env::temp_dir);
    let root = tempfile::Builder::new()
        .prefix("qlist-runs-bench-")
        .tempdir_in(&root_parent)
        .expect("bench temp dir");
    let merger = merger_path();
    let base_merger = base_merger_path();
    become_subreaper();
    let s3 = start_s3(root.path());
    let env = Env {
        merger,
        base_merger,
        s3,
        root: root.path().to_path_buf(),
        reps: env_or("QLIST_BENCH_REPS", DEFAULT_REPS).max(1),
    };
    eprintln!(
        "merger: {}; S3: {}; fixture root: {}; nproc {}; load average {}",
        env.merger.display(),
        env.s3.endpoint(),
        env.root.display(),
        std::thread::available_parallelism().map_or(0, |n| n.get()),
        load_average()
    );
    let cpu = Cpu::now();
    let start = Instant::now();
    let results: Vec<ShardResult> = shard_counts()
        .into_iter()
        .map(|shards| bench_shards(&env, shards, items, keep))
        .collect();
    let (steal, busy) = Cpu::now().since(cpu).percent();
    print_rows(&results);
    print_ratios(&results, Measured::wall, "medians");
    print_ratios(&results, Measured::best, "the best repetitions");
    print_flatness(&results);
    print_readers(&results);
    let verify: u32 = results.iter().map(|r| r.verify_failures).sum();
    let readers = results
        .iter()
        .flat_map(|r| &r.readers)
        .filter(|x| !x.count.is_some_and(|(_, right)| right) || x.range.is_none())
        .count();
    println!(
        "\nwhole run: {:.0}s, CPU steal {steal:.1}%, busy {busy:.0}% (of all CPUs, /proc/stat), \
         load average at the end {}; `merger verify` failures: {verify}; DuckDB failures: {readers}",
        start.elapsed().as_secs_f64(),
        load_average()
    );
    drop(env);
    if keep {
        let _ = root.keep();
    }
}
