//! Node passwords never leave the process that was given them: not in `idctl check`'s
//! output, not in `idctl next`'s errors, not in an idbroker's logs, and not in the replies
//! a broker sends its clients. Real redis-server processes with a password, a real
//! idbroker process (build it first: `cargo build --release --workspace --bins`). In a
//! target directory shared by several checkouts, `idbroker` is whichever checkout built it
//! last: build it from this one right before (an older broker fails this test).

mod common;
use common::{idbroker_bin, idctl, text};
use idtools::announced::{Announced, START_TIMEOUT};
use idtools::cluster::{node_command, test_quorum, LocalQuorum};
use std::process::{Command, Stdio};

const PASSWORD: &str = "Pw-7f3a9c-do-not-print";

/// Sets a password on every node of `q` (they start without one).
async fn require_password(q: &LocalQuorum) {
    for url in q.urls() {
        node_command(&url, &["CONFIG", "SET", "requirepass", PASSWORD]).await;
    }
}

#[track_caller]
fn assert_no_password(what: &str, out: &str) {
    assert!(
        !out.contains(PASSWORD),
        "{what} printed the password:\n{out}"
    );
}

#[tokio::test]
async fn no_output_of_a_failing_run_carries_a_node_password() {
    let mut q = test_quorum(3);
    require_password(&q).await;
    let urls: Vec<String> = q
        .ports()
        .iter()
        .map(|p| format!("redis://:{PASSWORD}@127.0.0.1:{p}"))
        .collect();
    let urls = urls.join(",");

    // With the password the nodes work (so the password is really in use).
    let next = idctl(&["next", "--nodes", &urls]);
    assert!(next.status.success(), "{}", text(&next));
    assert_no_password("idctl next", &text(&next));
    let check = idctl(&["check", "--nodes", &urls]);
    assert!(check.status.success(), "{}", text(&check));
    assert!(text(&check).contains(":***@127.0.0.1:"), "{}", text(&check));
    assert_no_password("idctl check", &text(&check));

    let mut broker = Announced::start(
        Command::new(idbroker_bin())
            .args(["--listen", "127.0.0.1:0", "--nodes", &urls])
            .env("RUST_LOG", "debug")
            .stderr(Stdio::piped()),
        &["listening on "],
        START_TIMEOUT,
    )
    .expect("idbroker starts");
    let addr = broker.addr().to_string();
    let next = idctl(&["next", "--broker", &addr]);
    assert!(next.status.success(), "{}", text(&next));

    // Two of three nodes gone: no quorum, everywhere.
    q.kill(1);
    q.kill(2);
    let check = idctl(&[
        "check",
        "--nodes",
        &urls,
        "--connect-timeout-ms",
        "300",
        "--reply-timeout-ms",
        "300",
    ]);
    assert!(!check.status.success());
    assert!(text(&check).contains("UNREACHABLE"), "{}", text(&check));
    assert_no_password("idctl check (nodes down)", &text(&check));

    let next = idctl(&["next", "--nodes", &urls, "--deadline-ms", "1000"]);
    assert!(!next.status.success());
    assert!(text(&next).contains("no quorum"), "{}", text(&next));
    assert!(text(&next).contains(":***@127.0.0.1:"), "{}", text(&next));
    assert_no_password("idctl next (no quorum)", &text(&next));

    let next = idctl(&["next", "--broker", &addr, "--deadline-ms", "1500"]);
    assert!(!next.status.success());
    assert!(text(&next).contains("no quorum"), "{}", text(&next));
    assert_no_password("idctl next --broker (the broker's reply)", &text(&next));

    broker.kill();
    let logs = broker.read_stderr();
    assert!(!logs.is_empty(), "idbroker logged nothing at debug level");
    assert_no_password("idbroker's log", &logs);
}
