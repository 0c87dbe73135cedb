//! idflags: qcli's ID-source flags turned into what the ID client takes, for the binaries
//! that get IDs (`idctl`, `idbroker`, `producer`): a [`ClientConfig`] for the quorum
//! ([`quorum_config`]), a [`BrokerClientConfig`] for brokers ([`broker_config`]), and the
//! [`IdsFrom`] that is one or the other ([`source`]).
//!
//! Its own crate, so that qcli does not depend on the ID client: `merger`, which gets no
//! IDs, depends on qcli and links none of the client (Redis, the rendezvous, the broker
//! client), in any build, including a `--workspace` one that unifies features
//! (`scripts/check-release.sh` checks the built file).

use idclient::broker_client::BrokerClientConfig;
use idclient::{BrokerTls, ClientCert, ClientConfig, Combine, IdError, Protocol, TlsConfig};
use qcli::{usage, BrokerArgs, BrokerTlsArgs, CombineArg, QuorumArgs, SourceArgs, TlsArgs};
use std::time::Duration;

/// The TLS settings of `--tls-*` (files are read when the client connects).
pub fn tls_config(args: &TlsArgs) -> TlsConfig {
    TlsConfig {
        ca_file: args.tls_ca.clone(),
        client_cert: match (&args.tls_cert, &args.tls_key) {
            (Some(cert_file), Some(key_file)) => Some(ClientCert {
                cert_file: cert_file.clone(),
                key_file: key_file.clone(),
            }),
            _ => None,
        },
    }
}

/// `--combine`'s value as the client's setting.
pub fn combine(c: CombineArg) -> Combine {
    match c {
        CombineArg::Auto => Combine::Auto,
        CombineArg::Always => Combine::Always,
        CombineArg::Never => Combine::Never,
    }
}

/// The quorum client's configuration the quorum flags describe, with `deadline` per
/// request.
///
/// # Errors
/// a usage error ([`qcli::usage`]) for no node or a zero timeout.
pub fn quorum_config(args: &QuorumArgs, deadline: Duration) -> anyhow::Result<ClientConfig> {
    let mut config = ClientConfig::new(args.nodes.urls()?);
    config.key = args.key.clone();
    config.protocol = if args.classic {
        Protocol::Classic
    } else {
        Protocol::Fast
    };
    config.deadline = deadline;
    config.connect_timeout = args.timeouts.connect()?;
    config.reply_timeout = args.timeouts.reply()?;
    config.unsafe_skip_durability_check = args.unsafe_skip_durability_check;
    config.backoff_cap = Duration::from_millis(args.backoff_cap_ms);
    config.combine = combine(args.combine);
    config.tls = tls_config(&args.tls);
    Ok(config)
}

/// The TLS settings of `--broker-tls-*`, files read and checked now (`None`: plain TCP).
///
/// # Errors
/// a usage error ([`qcli::usage`]) naming a file that cannot be read or holds no usable
/// certificate or key (never a key's content), or a bad server name.
pub fn broker_tls(args: &BrokerTlsArgs) -> anyhow::Result<Option<BrokerTls>> {
    let Some(ca) = &args.broker_tls_ca else {
        return Ok(None);
    };
    let client_cert = match (&args.broker_tls_cert, &args.broker_tls_key) {
        (Some(cert_file), Some(key_file)) => Some(ClientCert {
            cert_file: cert_file.clone(),
            key_file: key_file.clone(),
        }),
        _ => None,
    };
    BrokerTls::new(ca, args.broker_tls_server_name.clone(), client_cert)
        .map(Some)
        .map_err(|e| match e {
            IdError::Config(m) => usage(format!("broker TLS: {m}")),
            e => usage(format!("broker TLS: {e}")),
        })
}

/// The broker client's configuration the broker flags describe.
///
/// # Errors
/// a usage error ([`qcli::usage`]) for `--connections 0` or an unreadable or empty
/// `--broker-token-file` (naming the file, never its content).
pub fn broker_config(
    args: &BrokerArgs,
    deadline: Duration,
    connect_timeout: Duration,
) -> anyhow::Result<BrokerClientConfig> {
    if args.connections == 0 {
        return Err(usage("--connections must be at least 1"));
    }
    let token = match &args.broker_token_file {
        Some(path) => Some(
            idclient::Token::from_file(path)
                .map_err(|e| usage(format!("--broker-token-file: {e}")))?,
        ),
        None => None,
    };
    Ok(BrokerClientConfig {
        deadline,
        connect_timeout,
        connections: args.connections,
        in_flight: args.in_flight,
        token,
        tls: broker_tls(&args.tls)?,
        closed_list: args.broker_closed_list,
        ..BrokerClientConfig::default()
    })
}

/// Where IDs come from: straight from the quorum, or through brokers.
#[derive(Debug, Clone)]
pub enum IdsFrom {
    /// Direct mode (`--nodes`).
    Nodes(ClientConfig),
    /// Broker mode (`--broker`).
    Brokers {
        /// The broker addresses, tried in order.
        addrs: Vec<String>,
        /// The broker client's configuration.
        config: BrokerClientConfig,
    },
}

/// The ID source the ID-source flags describe.
///
/// # Errors
/// a usage error ([`qcli::usage`]) for an empty list, a zero timeout or deadline, or
/// `--connections 0`.
pub fn source(args: &SourceArgs) -> anyhow::Result<IdsFrom> {
    let deadline = args.deadline.deadline()?;
    let addrs = args.brokers.addrs();
    if args.brokers.broker.is_empty() {
        return Ok(IdsFrom::Nodes(quorum_config(&args.quorum, deadline)?));
    }
    if addrs.is_empty() {
        return Err(usage("--broker: no broker address given"));
    }
    let config = broker_config(&args.brokers, deadline, args.quorum.timeouts.connect()?)?;
    Ok(IdsFrom::Brokers { addrs, config })
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Debug, Parser)]
    struct Flags {
        #[command(flatten)]
        source: SourceArgs,
    }

    fn flags(args: &[&str]) -> Result<Flags, clap::Error> {
        Flags::try_parse_from(std::iter::once("t").chain(args.iter().copied()))
    }

    #[test]
    fn nodes_become_a_client_config() {
        let f = flags(&[
            "--nodes",
            "redis://a:1, redis://b:2,,redis://c:3",
            "--key",
            "k",
            "--deadline-ms",
            "1500",
            "--connect-timeout-ms",
            "70",
            "--reply-timeout-ms",
            "80",
            "--classic",
            "--combine",
            "never",
            "--backoff-cap-ms",
            "9",
        ])
        .expect("parses");
        let IdsFrom::Nodes(c) = source(&f.source).expect("valid") else {
            panic!("direct mode expected")
        };
        assert_eq!(c.nodes, ["redis://a:1", "redis://b:2", "redis://c:3"]);
        assert_eq!(c.key, "k");
        assert_eq!(c.deadline, Duration::from_millis(1500));
        assert_eq!(c.connect_timeout, Duration::from_millis(70));
        assert_eq!(c.reply_timeout, Duration::from_millis(80));
        assert_eq!(c.protocol, Protocol::Classic);
        assert_eq!(c.combine, Combine::Never);
        assert_eq!(c.backoff_cap, Duration::from_millis(9));
        assert!(!c.unsafe_skip_durability_check);
        assert_eq!(c.tls, TlsConfig::default());
    }

    #[test]
    fn tls_flags_become_the_tls_config() {
        let f = flags(&[
            "--nodes",
            "rediss://a:1",
            "--tls-ca",
            "ca.pem",
            "--tls-cert",
            "me.pem",
            "--tls-key",
            "me.key",
        ])
        .expect("parses");
        let IdsFrom::Nodes(c) = source(&f.source).expect("valid") else {
            panic!("direct mode expected")
        };
        assert_eq!(
            c.tls,
            TlsConfig {
                ca_file: Some("ca.pem".into()),
                client_cert: Some(ClientCert {
                    cert_file: "me.pem".into(),
                    key_file: "me.key".into(),
                }),
            }
        );
        for half in [&["--tls-cert", "me.pem"], &["--tls-key", "me.key"]] {
            let mut args = vec!["--nodes", "rediss://a:1"];
            args.extend_from_slice(half);
            let e = flags(&args).expect_err("a certificate without its key, or the reverse");
            assert_eq!(e.exit_code(), 2, "{args:?}");
        }
    }

    #[test]
    fn broker_tls_flags_are_checked_and_name_the_file() {
        let f = flags(&["--broker", "b:1"]).expect("parses");
        let IdsFrom::Brokers { config, .. } = source(&f.source).expect("valid") else {
            panic!("broker mode expected")
        };
        assert!(config.tls.is_none(), "plain TCP by default");
        let f = flags(&["--broker", "b:1", "--broker-tls-ca", "/no/such/ca.pem"]).expect("parses");
        let e = source(&f.source).expect_err("an unreadable CA file");
        assert!(e.to_string().contains("/no/such/ca.pem"), "{e}");
        for lone in [
            &["--broker-tls-server-name", "b"][..],
            &["--broker-tls-cert", "c.pem", "--broker-tls-key", "c.key"][..],
            &["--broker-tls-ca", "ca.pem", "--broker-tls-cert", "c.pem"][..],
        ] {
            let mut args = vec!["--broker", "b:1"];
            args.extend_from_slice(lone);
            let e = flags(&args).expect_err("a TLS flag without the ones it needs");
            assert_eq!(e.exit_code(), 2, "{args:?}");
        }
    }

    #[test]
    fn defaults_are_the_client_defaults() {
        let f = flags(&["--nodes", "redis://a:1"]).expect("parses");
        let IdsFrom::Nodes(c) = source(&f.source).expect("valid") else {
            panic!("direct mode expected")
        };
        let d = ClientConfig::new(vec!["redis://a:1".into()]);
        assert_eq!(
            (
                &c.key,
                c.protocol,
                c.deadline,
                c.connect_timeout,
                c.reply_timeout,
                c.backoff_cap,
                c.combine,
                c.unsafe_skip_durability_check,
                &c.tls
            ),
            (
                &d.key,
                d.protocol,
                d.deadline,
                d.connect_timeout,
                d.reply_timeout,
                d.backoff_cap,
                d.combine,
                d.unsafe_skip_durability_check,
                &d.tls
            )
        );
    }

    #[test]
    fn broker_defaults_are_the_client_defaults() {
        let f = flags(&["--broker", "h:1"]).expect("parses");
        let IdsFrom::Brokers { config, .. } = source(&f.source).expect("valid") else {
            panic!("broker mode expected")
        };
        let d = BrokerClientConfig::default();
        assert_eq!(
            (config.deadline, config.connections, config.in_flight),
            (d.deadline, d.connections, d.in_flight)
        );
    }

    #[test]
    fn the_old_timeout_flag_sets_both_and_conflicts_with_the_new_ones() {
        let f = flags(&["--nodes", "redis://a:1", "--timeout-ms", "300"]).expect("parses");
        let IdsFrom::Nodes(c) = source(&f.source).expect("valid") else {
            panic!("direct mode expected")
        };
        assert_eq!(c.connect_timeout, Duration::from_millis(300));
        assert_eq!(c.reply_timeout, Duration::from_millis(300));
        let e = flags(&[
            "--nodes",
            "redis://a:1",
            "--timeout-ms",
            "300",
            "--reply-timeout-ms",
            "5",
        ])
        .expect_err("conflict");
        assert_eq!(e.exit_code(), 2);
    }

    #[test]
    fn brokers_become_a_broker_config() {
        let f = flags(&[
            "--broker",
            "h:1,h:2",
            "--connections",
            "3",
            "--deadline-ms",
            "700",
            "--connect-timeout-ms",
            "40",
        ])
        .expect("parses");
        let IdsFrom::Brokers { addrs, config } = source(&f.source).expect("valid") else {
            panic!("broker mode expected")
        };
        assert_eq!(addrs, ["h:1", "h:2"]);
        assert_eq!(config.connections, 3);
        assert_eq!(config.deadline, Duration::from_millis(700));
        assert_eq!(config.connect_timeout, Duration::from_millis(40));
    }

    #[test]
    fn exactly_one_of_nodes_and_broker() {
        for args in [
            &[][..],
            &["--nodes", "redis://a:1", "--broker", "h:1"][..],
            &["--deadline-ms", "x", "--nodes", "redis://a:1"][..],
        ] {
            let e = flags(args).expect_err("usage error");
            assert_eq!(e.exit_code(), 2, "{args:?}");
        }
    }

    #[test]
    fn bad_values_are_usage_errors() {
        for args in [
            &["--nodes", ","][..],
            &["--broker", " "][..],
            &["--nodes", "redis://a:1", "--deadline-ms", "0"][..],
            &["--nodes", "redis://a:1", "--reply-timeout-ms", "0"][..],
            &["--broker", "h:1", "--connections", "0"][..],
        ] {
            let e = source(&flags(args).expect("parses").source).expect_err("refused");
            assert_eq!(
                qcli::cause_of(&e, |_| None),
                qcli::Cause::Usage,
                "{args:?}: {e:#}"
            );
        }
    }
}
