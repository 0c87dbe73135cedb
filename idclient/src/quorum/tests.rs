use super::round::{decide, Decision, Tally};
use super::*;
use crate::register::{WriteOutcome, WriteReply};

fn failure(addr: &str, reason: &str) -> NodeFailure {
    NodeFailure {
        addr: addr.into(),
        reason: reason.into(),
    }
}

/// A last round cut by the deadline keeps the cause the rounds before it saw.
#[test]
fn a_round_cut_by_the_deadline_keeps_the_earlier_cause() {
    let earlier = [
        failure("a", "the Redis ACL of this user denies it"),
        failure("b", CUT_BY_DEADLINE),
    ];
    let last = RoundLoss::Unreachable {
        reachable: 1,
        accepted: None,
        failures: vec![
            failure("a", CUT_BY_DEADLINE),
            failure("b", CUT_BY_DEADLINE),
            failure("c", "connection refused"),
        ],
    };
    let RoundLoss::Unreachable { failures, .. } = with_earlier_causes(last, &earlier) else {
        panic!("still unreachable");
    };
    let reasons: Vec<&str> = failures.iter().map(|f| f.reason.as_str()).collect();
    assert_eq!(
        reasons,
        [
            "the Redis ACL of this user denies it (the last round: no reply before the deadline)",
            CUT_BY_DEADLINE,
            "connection refused",
        ]
    );
    let contention = RoundLoss::Contention { all_rejected: true };
    assert!(matches!(
        with_earlier_causes(contention, &earlier),
        RoundLoss::Contention { all_rejected: true }
    ));
}

/// A node that refuses every connection at once, never answers, or accepts every
/// write.
struct Down {
    addr: String,
    silent: bool,
    accepts: bool,
}

impl Register for Down {
    fn addr(&self) -> &str {
        &self.addr
    }

    async fn conditional_write(
        &self,
        _key: &str,
        _lo: u64,
        _hi: u64,
        _batch: Option<Nonce>,
    ) -> Result<WriteOutcome, NodeError> {
        if self.silent {
            std::future::pending::<()>().await;
        }
        if self.accepts {
            return Ok(WriteOutcome {
                reply: WriteReply::Accepted,
                combining: false,
            });
        }
        Err(NodeError::Unavailable("connection refused".to_string()))
    }

    async fn read(&self, _key: &str) -> Result<u64, NodeError> {
        Err(NodeError::Unavailable("connection refused".to_string()))
    }

    async fn warm_up(&self) -> Result<(), NodeError> {
        Ok(())
    }
}

/// A write round lost as soon as three of five nodes refused counts the two silent
/// ones as neither answered nor failed: "0 of 5 nodes answered", not "2 of 5".
#[tokio::test(start_paused = true)]
async fn a_lost_write_round_counts_only_the_nodes_that_answered() {
    let nodes = (0..5)
        .map(|i| Down {
            addr: format!("fake://{i}"),
            silent: i >= 3,
            accepts: false,
        })
        .collect();
    let client = QuorumClient::with_nodes(nodes, "k", Protocol::Fast, Duration::from_secs(5))
        .expect("five nodes");
    let err = client
        .reserve(1, 1, Instant::now() + Duration::from_secs(5))
        .await
        .expect_err("three of five nodes down");
    assert_eq!(
        err.to_string(),
        "no quorum: 0 of 5 nodes answered, 0 accepted, 3 needed; 5 did not (failed: fake://0: connection refused; fake://1: connection refused; fake://2: connection refused; 2 not asked, or not waited for)"
    );
}

/// A write round lost to unreachable nodes says how many of the nodes that answered
/// accepted, beside how many answered and how many were needed.
#[tokio::test(start_paused = true)]
async fn a_lost_write_round_says_how_many_accepted() {
    // Node 0 accepts, nodes 1-3 refuse, node 4 never answers.
    let nodes = (0..5)
        .map(|i| Down {
            addr: format!("fake://{i}"),
            silent: i == 4,
            accepts: i == 0,
        })
        .collect();
    let client = QuorumClient::with_nodes(nodes, "k", Protocol::Fast, Duration::from_secs(5))
        .expect("five nodes");
    let err = client
        .reserve(1, 1, Instant::now() + Duration::from_secs(5))
        .await
        .expect_err("three of five nodes down");
    assert!(
        matches!(
            err,
            IdError::NoQuorum {
                needed: 3,
                reachable: 1,
                accepted: Some(1),
                total: 5,
                ..
            }
        ),
        "{err:?}"
    );
    assert_eq!(
        err.to_string(),
        "no quorum: 1 of 5 nodes answered, 1 accepted, 3 needed; 4 did not (failed: fake://1: connection refused; fake://2: connection refused; fake://3: connection refused; 1 not asked, or not waited for)"
    );
}

fn tally(accepts: usize, rejects: usize, failures: usize) -> Tally {
    Tally {
        accepts,
        rejects,
        failures,
        max_seen: 0,
    }
}

#[test]
fn majority_of_accepts_wins() {
    assert_eq!(decide(5, &tally(3, 0, 0)), Decision::Won);
    assert_eq!(decide(5, &tally(3, 2, 0)), Decision::Won);
    assert_eq!(decide(3, &tally(2, 0, 1)), Decision::Won);
    assert_eq!(decide(1, &tally(1, 0, 0)), Decision::Won);
}

#[test]
fn round_is_lost_once_a_majority_cannot_accept() {
    assert_eq!(decide(5, &tally(0, 3, 0)), Decision::Lost);
    assert_eq!(decide(5, &tally(2, 2, 1)), Decision::Lost);
    assert_eq!(decide(5, &tally(0, 0, 3)), Decision::Lost);
    assert_eq!(decide(3, &tally(1, 1, 1)), Decision::Lost);
}

#[test]
fn undecided_until_certain() {
    assert_eq!(decide(5, &tally(2, 2, 0)), Decision::Pending);
    assert_eq!(decide(5, &tally(0, 2, 0)), Decision::Pending);
    assert_eq!(decide(5, &tally(2, 0, 2)), Decision::Pending);
}
