//! The README's Slurm recipe on a real Slurm: this test starts munged, slurmctld and
//! slurmd (Debian's `munge` and `slurm-wlm`, installed by `scripts/deps.sh`) on this one
//! machine with a config in a temp dir, then runs the README's commands as written: the
//! producers as an `sbatch --array` job sealing runs into a shared directory, the merge
//! as K parts in a second array job that depends on the first (`afterok`), then `merger
//! verify` of the K parts as one list. The job scripts are the files the README shows,
//! docs/slurm/*.sbatch, submitted from the repository's root.
//!
//! A daemon that cannot start, a node that never becomes idle, or a job that does not
//! complete fails the test with the daemons' logs and the jobs' output: it never skips.
//! Needs root (slurmd runs jobs as their submitter, and munged's socket checks) and the
//! workspace binaries (`cargo build --release --workspace --bins`), which the jobs find
//! on PATH as `producer` and `merger`.

mod common;

use common::{bin, Proc};
use idtools::cluster::{free_port, LocalQuorum};
use std::collections::BTreeMap;
use std::io::Read;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};
use testkit::wait_for;

/// Items in each shard's input file: small (the test is about the scheduler), unequal,
/// one shard with a single item.
const ITEMS: [u64; 4] = [400, 1, 250, 120];
/// The merge's parts: K in the README.
const PARTS: usize = 3;
/// Until the daemons answer and the node is idle: they are up in about a second.
const START_LIMIT: Duration = Duration::from_secs(60);
/// Until an array job has finished: seconds, mostly the scheduler's own pauses.
const JOB_LIMIT: Duration = Duration::from_secs(120);

/// Item `i` of shard `s`: the line in its input file, and so the payload in the list.
fn item(s: usize, i: u64) -> String {
    format!("shard {s} item {i}")
}

/// A command of the Slurm or MUNGE packages: on PATH, or in the sbin directories where
/// Debian puts the daemons (a PATH may lack them).
fn slurm_cmd(name: &str) -> PathBuf {
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .chain(["/usr/local/sbin", "/usr/sbin", "/sbin"].map(PathBuf::from))
        .map(|d| d.join(name))
        .find(|p| p.is_file())
        .unwrap_or_else(|| {
            panic!(
                "{name} not found on PATH or in the sbin directories: this test runs a real \
                 Slurm (Debian packages slurm-wlm and munge; `bash scripts/deps.sh` installs them)"
            )
        })
}

/// A one-node Slurm cluster in a temp dir: munged on its own socket, slurmctld and slurmd
/// in the foreground, each stopped by its own pid when dropped (testkit's guard: SIGTERM, then SIGKILL).
struct Slurm {
    conf: PathBuf,
    // Stopped in this order: slurmd, then slurmctld, then munged (fields drop in order),
    // and only then is the dir removed.
    slurmd: Proc,
    slurmctld: Proc,
    munged: Proc,
    dir: tempfile::TempDir,
}

impl Slurm {
    fn start() -> Slurm {
        let dir = tempfile::tempdir().expect("tempdir for the Slurm cluster");
        // munged refuses a socket whose directories are not searchable by everyone.
        std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755))
            .expect("chmod the Slurm dir");
        for sub in ["munge", "state", "spool", "log", "run"] {
            std::fs::create_dir(dir.path().join(sub)).expect("create a Slurm subdir");
        }
        let munged = start_munged(dir.path());
        let conf = dir.path().join("slurm.conf");
        std::fs::write(&conf, slurm_conf(dir.path())).expect("write slurm.conf");
        let log = |name: &str| log_file(dir.path(), name);
        let slurmctld = Proc::spawn(
            "slurmctld",
            Command::new(slurm_cmd("slurmctld"))
                .args(["-D", "-f"])
                .arg(&conf)
                .stdout(log("slurmctld.out"))
                .stderr(log("slurmctld.log")),
        );
        let slurmd = Proc::spawn(
            "slurmd",
            Command::new(slurm_cmd("slurmd"))
                .args(["-D", "-N", NODE, "-f"])
                .arg(&conf)
                .stdout(log("slurmd.out"))
                .stderr(log("slurmd.log")),
        );
        let mut slurm = Slurm {
            dir,
            conf,
            slurmd,
            slurmctld,
            munged,
        };
        slurm.wait_idle();
        slurm
    }

    /// Waits until `sinfo` says the node is idle; fails with the daemons' logs if it never
    /// is, or at once if a daemon exits.
    fn wait_idle(&mut self) {
        let mut state = String::new();
        let mut exited = None;
        let waited = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            wait_for("sinfo shows the node idle", START_LIMIT, || {
                for p in [&mut self.munged, &mut self.slurmctld, &mut self.slurmd] {
                    if let Some(status) = p.try_wait() {
                        exited = Some(format!("{} exited ({status})", p.name()));
                        return true;
                    }
                }
                let out = self.cmd("sinfo").args(["-h", "-N", "-o", "%T"]).output();
                state = out.map_or_else(|e| e.to_string(), |o| text(&o).trim().to_string());
                state == "idle"
            })
        }));
        if let Some(exited) = exited {
            panic!(
                "{exited} while the cluster started:\n{}",
                logs(self.dir.path())
            );
        }
        if waited.is_err() {
            panic!(
                "the Slurm node never became idle (last sinfo: {state:?}):\n{}",
                logs(self.dir.path())
            );
        }
    }

    /// A Slurm client command talking to this cluster.
    fn cmd(&self, name: &str) -> Command {
        let mut cmd = Command::new(slurm_cmd(name));
        cmd.env("SLURM_CONF", &self.conf);
        cmd
    }

    /// The state of every task of array job `id` (`scontrol show job`), by task.
    fn job_states(&self, id: &str) -> BTreeMap<String, String> {
        let out = self
            .cmd("scontrol")
            .args(["-o", "show", "job", id])
            .output()
            .expect("run scontrol");
        let mut states = BTreeMap::new();
        for line in text(&out).lines() {
            let field = |name: &str| {
                line.split_whitespace()
                    .find_map(|f| f.strip_prefix(name))
                    .unwrap_or("?")
                    .to_string()
            };
            states.insert(field("ArrayTaskId="), field("JobState="));
        }
        states
    }

    /// Waits until no task of array job `id` is pending or running, then asserts that
    /// each of `tasks` completed; fails with the jobs' output and the daemons' logs.
    fn wait_completed(&self, what: &str, id: &str, tasks: usize, jobs_log: &Path) {
        const LIVE: [&str; 6] = [
            "PENDING",
            "CONFIGURING",
            "RUNNING",
            "COMPLETING",
            "REQUEUED",
            "SUSPENDED",
        ];
        let mut states = BTreeMap::new();
        let waited = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            wait_for(&format!("{what} (job {id}) finished"), JOB_LIMIT, || {
                states = self.job_states(id);
                !states.is_empty() && !states.values().any(|s| LIVE.contains(&s.as_str()))
            })
        }));
        let done = states.values().filter(|s| *s == "COMPLETED").count();
        if waited.is_err() || done != tasks || states.len() != tasks {
            panic!(
                "{what} (job {id}): {done} of {tasks} tasks completed, states {states:?}\n\
                 --- the jobs' output\n{}\n--- the daemons\n{}",
                logs(jobs_log),
                logs(self.dir.path())
            );
        }
    }
}

/// The node's name in slurm.conf (slurmd is told it with -N: no hostname involved).
const NODE: &str = "qlist-node";

/// Starts munged with a fresh key and its own socket in `dir`/munge.
fn start_munged(dir: &Path) -> Proc {
    let m = dir.join("munge");
    std::fs::set_permissions(&m, std::fs::Permissions::from_mode(0o755)).expect("chmod munge");
    let key = m.join("munge.key");
    let mut bytes = Vec::new();
    std::fs::File::open("/dev/urandom")
        .and_then(|f| f.take(1024).read_to_end(&mut bytes))
        .expect("read a munge key from /dev/urandom");
    std::fs::write(&key, &bytes).expect("write munge.key");
    std::fs::set_permissions(&key, std::fs::Permissions::from_mode(0o400)).expect("chmod key");
    let mut munged = Proc::spawn(
        "munged",
        Command::new(slurm_cmd("munged"))
            .arg("--foreground")
            .arg(format!("--socket={}", m.join("munge.socket").display()))
            .arg(format!("--key-file={}", key.display()))
            .arg(format!("--pid-file={}", m.join("munged.pid").display()))
            .arg(format!("--seed-file={}", m.join("munged.seed").display()))
            .stdout(log_file(dir, "munged.out"))
            .stderr(log_file(dir, "munged.log")),
    );
    wait_for("munged made its socket", START_LIMIT, || {
        if let Some(status) = munged.try_wait() {
            panic!("munged exited ({status}) at start:\n{}", logs(dir));
        }
        m.join("munge.socket").exists()
    });
    munged
}

/// slurm.conf for one node with this machine's CPUs and memory (as `slurmd -C` finds
/// them: a node configured with more than it has is drained), free ports, every file in
/// `dir`, and plugins that need neither systemd nor cgroups nor a database. Both daemons
/// have their address spelled out (`localhost(127.0.0.1)`, `NodeAddr`): a fresh
/// debootstrap root has no /etc/hosts, and there `localhost` does not resolve.
fn slurm_conf(dir: &Path) -> String {
    let out = Command::new(slurm_cmd("slurmd"))
        .arg("-C")
        .output()
        .expect("run slurmd -C");
    let hardware: Vec<&str> = std::str::from_utf8(&out.stdout)
        .expect("slurmd -C prints text")
        .lines()
        .next()
        .unwrap_or_default()
        .split_whitespace()
        .filter(|f| !f.starts_with("NodeName="))
        .collect();
    assert!(
        out.status.success() && hardware.iter().any(|f| f.starts_with("CPUs=")),
        "slurmd -C did not describe this machine: {out:?}"
    );
    let d = dir.display();
    let (ctld_port, slurmd_port) = (free_port().expect("port"), free_port().expect("port"));
    format!(
        "ClusterName=qlisttest
SlurmctldHost=localhost(127.0.0.1)
SlurmctldPort={ctld_port}
SlurmdPort={slurmd_port}
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket={d}/munge/munge.socket
StateSaveLocation={d}/state
SlurmdSpoolDir={d}/spool
SlurmctldPidFile={d}/run/slurmctld.pid
SlurmdPidFile={d}/run/slurmd.pid
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
MpiDefault=none
MailProg=/bin/true
SchedulerType=sched/backfill
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
ReturnToService=2
NodeName={NODE} NodeAddr=127.0.0.1 {} State=UNKNOWN
PartitionName=qlist Nodes={NODE} Default=YES MaxTime=INFINITE State=UP
",
        hardware.join(" ")
    )
}

/// A new file in `dir`/log for a daemon's output.
fn log_file(dir: &Path, name: &str) -> Stdio {
    std::fs::File::create(dir.join("log").join(name))
        .expect("create a log file")
        .into()
}

/// Every file under `dir`/log (or `dir` itself if it has none), for failure messages.
fn logs(dir: &Path) -> String {
    let log = dir.join("log");
    let dir = if log.is_dir() { log } else { dir.to_path_buf() };
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .map(|r| r.filter_map(Result::ok).map(|e| e.path()).collect())
        .unwrap_or_default();
    files.sort();
    files
        .iter()
        .map(|f| {
            let body = std::fs::read_to_string(f).unwrap_or_else(|e| e.to_string());
            format!("=== {}\n{body}", f.display())
        })
        .collect()
}

fn text(out: &Output) -> String {
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// The README's fenced `sh` block that starts with `first`, as written.
fn readme_block(readme: &str, first: &str) -> String {
    readme
        .split("```sh\n")
        .skip(1)
        .filter_map(|b| b.split_once("\n```").map(|(body, _)| body))
        .find(|b| b.starts_with(first))
        .unwrap_or_else(|| panic!("README.md has no ```sh block starting with {first:?}"))
        .to_string()
}

#[test]
fn readme_recipe_on_a_real_slurm() {
    let started = Instant::now();
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let readme = std::fs::read_to_string(root.join("README.md")).expect("read README.md");
    for script in ["docs/slurm/produce.sbatch", "docs/slurm/merge.sbatch"] {
        let body = std::fs::read_to_string(root.join(script)).expect("read a job script");
        assert!(
            readme.contains(&body),
            "README.md must show {script} exactly as the file has it"
        );
    }
    let submit = readme_block(&readme, "produce=$(sbatch");
    let verify = readme_block(&readme, "merger verify");

    let quorum = LocalQuorum::temp(3)
        .expect("start a local 3-node redis quorum (is redis-server installed?)");
    let slurm = Slurm::start();
    let job = tempfile::tempdir().expect("tempdir for the job");
    let job_dir = job.path().join("job-42");
    let input = job_dir.join("input");
    std::fs::create_dir_all(&input).expect("create the input dir");
    for (s, &n) in ITEMS.iter().enumerate() {
        let lines: String = (0..n).map(|i| item(s, i) + "\n").collect();
        std::fs::write(input.join(format!("part-{s}.txt")), lines).expect("write an input");
    }
    let jobs_log = job.path().join("log");
    std::fs::create_dir(&jobs_log).expect("create the jobs' log dir");
    // The environment the README's `export` line sets up, plus where this cluster and the
    // binaries are; sbatch hands all of it to the jobs.
    let bins = bin("producer").parent().expect("bin dir").to_path_buf();
    let path = std::env::join_paths(std::iter::once(bins).chain(std::env::split_paths(
        &std::env::var_os("PATH").unwrap_or_default(),
    )))
    .expect("PATH");
    let shell = |script: &str| {
        let mut cmd = Command::new("sh");
        cmd.arg("-eu")
            .arg("-c")
            .arg(script)
            .current_dir(root)
            .env("PATH", &path)
            .env("SLURM_CONF", &slurm.conf)
            .env("SBATCH_OUTPUT", jobs_log.join("%x-%A_%a.out"))
            .env("TMPDIR", job.path())
            .env("JOB_DIR", &job_dir)
            .env("SHARDS", ITEMS.len().to_string())
            .env("K", PARTS.to_string())
            .env("QLIST_NODES", quorum.urls_arg());
        cmd
    };

    let out = shell(&format!("{submit}\necho \"$produce $merge\""))
        .output()
        .expect("run the README's sbatch commands");
    common::check_output(&out, "the README's sbatch commands");
    let said = text(&out);
    let ids: Vec<&str> = said.split_whitespace().collect();
    let [produce, merge] = ids[..] else {
        panic!("the sbatch commands printed {said:?}, not two job IDs");
    };
    slurm.wait_completed("the producers", produce, ITEMS.len(), &jobs_log);
    slurm.wait_completed("the merge", merge, PARTS, &jobs_log);

    let out = shell(&verify).output().expect("run merger verify");
    common::check_output(&out, "the README's merger verify");
    let total: u64 = ITEMS.iter().sum();
    let said = text(&out);
    assert!(
        said.contains(&format!("OK: {total} records in {PARTS} parts"))
            && said.contains(&format!("{} shards complete", ITEMS.len())),
        "merger verify: {said}"
    );
    check_items(&job_dir.join("list"));
    eprintln!("slurm recipe: {:.1}s", started.elapsed().as_secs_f64());
}

/// `merger cat` of the parts in order: every input line once, in strictly increasing ID
/// order, each shard's items in their input order.
fn check_items(list: &Path) {
    let parts: Vec<PathBuf> = (0..PARTS)
        .map(|i| list.join(format!("part-{i}.bin")))
        .collect();
    let out = Command::new(bin("merger"))
        .arg("cat")
        .args(&parts)
        .output()
        .expect("run merger cat");
    common::check_output(&out, "merger cat of the parts");
    let mut last_id = None;
    let mut seqs: BTreeMap<usize, Vec<u64>> = BTreeMap::new();
    for line in text(&out).lines() {
        let f: Vec<&str> = line.splitn(4, '\t').collect();
        let [id, shard, seq, payload] = f[..] else {
            panic!("merger cat line {line:?}");
        };
        let (id, shard, seq): (u64, usize, u64) = (
            id.parse().expect("id"),
            shard.parse().expect("shard"),
            seq.parse().expect("seq"),
        );
        assert!(last_id < Some(id), "id {id} after {last_id:?}");
        last_id = Some(id);
        assert_eq!(
            payload,
            item(shard, seq),
            "payload of shard {shard} seq {seq}"
        );
        seqs.entry(shard).or_default().push(seq);
    }
    for (s, &n) in ITEMS.iter().enumerate() {
        let got = seqs.remove(&s).unwrap_or_default();
        assert!(
            got.iter().copied().eq(0..n),
            "shard {s}: {} items, not seqs 0..{n} in order",
            got.len()
        );
    }
    assert!(seqs.is_empty(), "unknown shards {:?}", seqs.keys());
}
