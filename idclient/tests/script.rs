//! The Lua scripts themselves, on a real redis-server: the conditional write's exact u64
//! comparison (near 2^53, 2^63 and u64::MAX, where Lua's doubles would round), and a
//! differential test holding the simulation's rendezvous model (`testkit::sim`) to
//! what `script::COMBINE` and `script::CONDITIONAL_WRITE` really answer.

use idclient::{Close, Join, Leases, Nonce};
use idclient::{Node, Register, Rendezvous, WriteOutcome, WriteReply};
use idtools::cluster::{test_quorum, LocalQuorum};
use proptest::prelude::*;
use rand::{Rng, SeedableRng};
use std::time::Duration;
use testkit::sim::{Mutant, SimCluster, SimConfig};

fn redis_node() -> (LocalQuorum, Node, redis::Client) {
    let q = test_quorum(1);
    let url = q.urls()[0].clone();
    let timeout = Duration::from_secs(5);
    let node = Node::new(&url, timeout, timeout, true).expect("a valid node URL");
    let raw = redis::Client::open(url.as_str()).expect("a valid redis URL");
    (q, node, raw)
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("build a tokio runtime")
}

/// Values where a double-based comparison would go wrong, and ordinary ones.
fn value() -> impl Strategy<Value = u64> {
    prop_oneof![
        any::<u64>(),
        0u64..1000,
        (1u64 << 53) - 4..(1u64 << 53) + 4,
        (1u64 << 63) - 4..(1u64 << 63) + 4,
        u64::MAX - 8..=u64::MAX,
    ]
}

#[test]
fn the_conditional_write_compares_exactly_on_redis() {
    let (_q, node, raw) = redis_node();
    let rt = runtime();
    let conn = rt
        .block_on(raw.get_multiplexed_async_connection())
        .expect("connect to the node");
    let mut runner = proptest::test_runner::TestRunner::new(ProptestConfig::with_cases(400));
    // `current` is independent of LO, or within 2 of it (the equality boundary).
    let case = (value(), -2i64..=2, any::<bool>(), 0u64..3, any::<bool>());
    runner
        .run(&case, |(lo, delta, near, width, missing)| {
            let lo = lo.max(1);
            let hi = lo.saturating_add(width);
            let current = if missing {
                0
            } else if near {
                lo.saturating_add_signed(delta)
            } else {
                lo.rotate_left(17) ^ width
            };
            let key = "register";
            let mut conn = conn.clone();
            let written = rt.block_on(async {
                if missing {
                    let _: () = redis::cmd("DEL")
                        .arg(key)
                        .query_async(&mut conn)
                        .await
                        .expect("DEL");
                } else {
                    let _: () = redis::cmd("SET")
                        .arg(key)
                        .arg(current.to_string())
                        .query_async(&mut conn)
                        .await
                        .expect("SET");
                }
                node.conditional_write(key, lo, hi, None).await
            });
            let after = rt.block_on(node.read(key)).expect("read back");
            let expected = if current < lo {
                (WriteReply::Accepted, hi)
            } else {
                (WriteReply::Rejected { current }, current)
            };
            let written = written.map_err(|e| TestCaseError::fail(format!("{e:?}")))?;
            prop_assert_eq!(
                (written.reply, after),
                expected,
                "current {} lo {} hi {}",
                current,
                lo,
                hi
            );
            Ok(())
        })
        .expect("the script's comparison is exact");
}

/// One rendezvous or register operation.
#[derive(Debug, Clone, Copy)]
enum Op {
    Join { n: u64, nonce: usize },
    Close { nonce: usize },
    Finish { nonce: usize },
    Write { lo: u64, batch: Option<usize> },
    Read,
}

/// A reply with the lease times left out (real PTTLs and virtual ones differ).
#[derive(Debug, PartialEq, Eq)]
enum Reply {
    Join(Join),
    Close(Close),
    Finished,
    WriteOutcome(WriteOutcome),
    Read(u64),
    Failed(String),
}

fn without_waits(reply: Reply) -> Reply {
    match reply {
        Reply::Join(Join::Follow { batch, offset, .. }) => Reply::Join(Join::Follow {
            batch,
            offset,
            wait: Duration::ZERO,
        }),
        Reply::Join(Join::Lead { busy, .. }) => Reply::Join(Join::Lead {
            busy,
            wait: Duration::ZERO,
        }),
        Reply::Close(Close::Busy { busy, .. }) => Reply::Close(Close::Busy {
            busy,
            wait: Duration::ZERO,
        }),
        other => other,
    }
}

/// Leases long enough that nothing expires during a sequence, and no longer than any
/// client asks for (a batch lease is at most two leases): the script deletes a key that
/// holds longer as stray, which the model does not model.
const LEASE: Duration = Duration::from_secs(2 * idclient::MAX_LEASE.as_secs());

async fn apply<R: Register + Rendezvous>(node: &R, key: &str, nonces: &[Nonce], op: Op) -> Reply {
    let leases = Leases {
        round: LEASE,
        batch: LEASE,
    };
    let failed = |e| Reply::Failed(format!("{e:?}"));
    match op {
        Op::Join { n, nonce } => node
            .join(key, n, nonces[nonce], leases)
            .await
            .map_or_else(failed, Reply::Join),
        Op::Close { nonce } => node
            .close(key, nonces[nonce], LEASE)
            .await
            .map_or_else(failed, Reply::Close),
        Op::Finish { nonce } => {
            let message = format!("{} failed", nonces[nonce]);
            node.finish(key, nonces[nonce], message)
                .await
                .map_or_else(failed, |()| Reply::Finished)
        }
        Op::Write { lo, batch } => node
            .conditional_write(key, lo, lo + 2, batch.map(|b| nonces[b]))
            .await
            .map_or_else(failed, Reply::WriteOutcome),
        Op::Read => node.read(key).await.map_or_else(failed, Reply::Read),
    }
}

fn random_op(rng: &mut impl Rng) -> Op {
    let nonce = rng.gen_range(0..3);
    match rng.gen_range(0..10) {
        0..=3 => Op::Join {
            // Now and then a count that cannot fit an open batch.
            n: if rng.gen_bool(0.1) {
                idclient::MAX_COUNT
            } else {
                rng.gen_range(1..=3)
            },
            nonce,
        },
        4..=5 => Op::Close { nonce },
        6..=7 => Op::Finish { nonce },
        8 => Op::Write {
            lo: rng.gen_range(1..=20),
            batch: rng.gen_bool(0.5).then_some(nonce),
        },
        _ => Op::Read,
    }
}

/// Runs the random sequences against redis and the model (with `mutant`); the first
/// disagreement, if any.
async fn first_disagreement(node: &Node, mutant: Option<Mutant>, tag: &str) -> Option<String> {
    for seed in 0..100u64 {
        let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
        let nonces: Vec<Nonce> = (0..3).map(|_| Nonce(rng.gen())).collect();
        let config = SimConfig {
            nodes: 1,
            loss: 0.0,
            duplicate: 0.0,
            max_delay: Duration::ZERO,
            reply_timeout: Duration::from_secs(10),
            mutant,
            ..SimConfig::default()
        };
        let cluster = SimCluster::new(config, seed);
        let model = &cluster.nodes()[0];
        let key = format!("{tag}-{seed}");
        let mut ops = Vec::new();
        for step in 0..40 {
            let op = random_op(&mut rng);
            ops.push(op);
            let real = without_waits(apply(node, &key, &nonces, op).await);
            let sim = without_waits(apply(model, &key, &nonces, op).await);
            assert!(
                !matches!(real, Reply::Failed(_)),
                "seed {seed} step {step}: redis failed: {real:?}"
            );
            if real != sim {
                return Some(format!(
                    "seed {seed} step {step}: redis {real:?}, model {sim:?}, after {ops:?}"
                ));
            }
        }
    }
    None
}

#[test]
fn the_rendezvous_model_answers_as_the_lua_script_does() {
    let (_q, node, _raw) = redis_node();
    runtime().block_on(async {
        if let Some(d) = first_disagreement(&node, None, "model").await {
            panic!("the model and the script disagree: {d}");
        }
        // The comparison has teeth: each broken model is told apart from the script.
        for mutant in [
            Mutant::MemberOffset,
            Mutant::WriteIfNotAbove,
            Mutant::CompareWithHi,
        ] {
            let tag = format!("{mutant:?}");
            assert!(
                first_disagreement(&node, Some(mutant), &tag)
                    .await
                    .is_some(),
                "{mutant:?} answers as the script does"
            );
        }
    });
}
