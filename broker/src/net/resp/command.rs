//! RESP commands: what each request asks of its connection, decided without I/O.

use super::reply::{echo, stats_reply, Reply, RespVersion};
use crate::stats::Stats;
use idproto::auth::Token;

/// The server name `HELLO` reports.
const SERVER_NAME: &str = "qlist";

/// What a request asks of its connection.
#[derive(Debug, PartialEq)]
pub(super) enum Action {
    /// Send this reply; with a version, it and every later reply are encoded in it.
    Reply(Reply, Option<RespVersion>),
    /// `count` IDs from the batcher.
    Next(u64),
    /// `+OK`, then close.
    Quit,
    /// As `Reply`, and the connection is now authenticated (`AUTH`, `HELLO .. AUTH`).
    Unlock(Reply, Option<RespVersion>),
    /// A wrong token (`AUTH`, `HELLO .. AUTH`, a token configured): this reply, and the
    /// connection is one failure closer to being closed.
    Denied(Reply),
}

/// What a connection's earlier requests decided.
#[derive(Debug, Clone, Copy)]
pub(super) struct Session {
    /// May run commands: no token is configured, or the client gave it.
    pub authenticated: bool,
    /// The version replies are encoded in from the next request on (requests are
    /// handled in order, so this is what the writer will use for it).
    pub proto: RespVersion,
}

/// What `args` (a command name, then its arguments) asks for. Names are
/// case-insensitive. `token` is the broker's `--auth-token-file`: until it is given,
/// only `AUTH`, `HELLO .. AUTH` and `QUIT` run, as in Redis with `requirepass`; a
/// refused request (`NOAUTH`) is no activity of the connection, a wrong token is
/// [`Action::Denied`].
pub(super) fn command(
    args: &[Vec<u8>],
    session: &Session,
    stats: &Stats,
    token: Option<&Token>,
) -> Action {
    let Some((name_bytes, rest)) = args.split_first() else {
        return Action::Reply(Reply::err("ERR empty command"), None);
    };
    let name = String::from_utf8_lossy(name_bytes).to_ascii_uppercase();
    if !session.authenticated && !matches!(name.as_str(), "AUTH" | "HELLO" | "QUIT") {
        return Action::Reply(Reply::err("NOAUTH Authentication required."), None);
    }
    let reply = match name.as_str() {
        "QLIST.NEXT" => match parse_count(rest) {
            Ok(count) => return Action::Next(count),
            Err(reply) => reply,
        },
        "QLIST.STATS" if rest.is_empty() => stats_reply(&stats.snapshot()),
        "ECHO" => match rest {
            [msg] => Reply::Bulk(msg.clone()),
            _ => wrong_args(&name),
        },
        "PING" => match rest {
            [] => Reply::Simple("PONG".into()),
            [msg] => Reply::Bulk(msg.clone()),
            _ => wrong_args(&name),
        },
        "HELLO" => match hello(rest, session, token) {
            Ok((reply, proto)) => return Action::Unlock(reply, Some(proto)),
            Err(reply) if token.is_some() && is_wrongpass(&reply) => return Action::Denied(reply),
            Err(reply) => reply,
        },
        "AUTH" => {
            let denied = match rest {
                [password] => check(token, None, password),
                [user, password] => check(token, Some(user), password),
                _ => Some(Reply::err("ERR syntax error")),
            };
            return match denied {
                Some(reply) if token.is_some() && is_wrongpass(&reply) => Action::Denied(reply),
                Some(reply) => Action::Reply(reply, None),
                None => Action::Unlock(Reply::ok(), None),
            };
        }
        "QUIT" => return Action::Quit,
        // What client libraries send on connect, accepted so they connect as to Redis.
        "CLIENT" => client(rest),
        "SELECT" => match rest {
            [db] if db.as_slice() == b"0" => Reply::ok(),
            [_] => Reply::err("ERR DB index is out of range"),
            _ => wrong_args(&name),
        },
        "QLIST.STATS" => wrong_args(&name),
        _ => Reply::err(format!(
            "ERR unknown command '{}', with args beginning with: {}",
            echo(name_bytes),
            rest.iter()
                .take(3)
                .map(|a| format!("'{}' ", echo(a)))
                .collect::<String>()
        )),
    };
    Action::Reply(reply, None)
}

/// `HELLO [protover [AUTH user password] [SETNAME name]]`: the server's description
/// and the version to speak from this reply on.
fn hello(
    args: &[Vec<u8>],
    session: &Session,
    token: Option<&Token>,
) -> Result<(Reply, RespVersion), Reply> {
    let proto = match args.first().map(|v| v.as_slice()) {
        None => None,
        Some(b"2") => Some(RespVersion::Resp2),
        Some(b"3") => Some(RespVersion::Resp3),
        Some(v) if std::str::from_utf8(v).is_ok_and(|s| s.parse::<i64>().is_ok()) => {
            return Err(Reply::err("NOPROTO unsupported protocol version"));
        }
        Some(_) => {
            return Err(Reply::err(
                "ERR Protocol version is not an integer or out of range",
            ))
        }
    };
    let mut options = args.iter().skip(1);
    let mut authenticated = session.authenticated;
    while let Some(option) = options.next() {
        match option.to_ascii_uppercase().as_slice() {
            b"AUTH" => {
                let (Some(user), Some(password)) = (options.next(), options.next()) else {
                    return Err(Reply::err("ERR Syntax error in HELLO option 'AUTH'"));
                };
                if let Some(denied) = check(token, Some(user), password) {
                    return Err(denied);
                }
                authenticated = true;
            }
            b"SETNAME" => {
                if options.next().is_none() {
                    return Err(Reply::err("ERR Syntax error in HELLO option 'SETNAME'"));
                }
            }
            _ => {
                return Err(Reply::err(format!(
                    "ERR Syntax error in HELLO option '{}'",
                    echo(option)
                )))
            }
        }
    }
    if !authenticated {
        return Err(Reply::err("NOAUTH HELLO must be called with the client already authenticated, otherwise the HELLO <proto> AUTH <user> <pass> option can be used to authenticate the client and select the RESP protocol version at the same time"));
    }
    // HELLO without a version keeps the current one.
    let proto = proto.unwrap_or(session.proto);
    let reply = Reply::Map(vec![
        ("server".into(), Reply::Bulk(SERVER_NAME.into())),
        (
            "version".into(),
            Reply::Bulk(env!("CARGO_PKG_VERSION").into()),
        ),
        ("proto".into(), Reply::Int(proto.number())),
        ("mode".into(), Reply::Bulk("standalone".into())),
        ("role".into(), Reply::Bulk("master".into())),
        ("modules".into(), Reply::Array(Vec::new())),
    ]);
    Ok((reply, proto))
}

/// `CLIENT SETNAME name` and `CLIENT SETINFO attribute value` (accepted, not kept);
/// any other subcommand is unknown.
fn client(args: &[Vec<u8>]) -> Reply {
    let sub = args
        .first()
        .map(|s| s.to_ascii_uppercase())
        .unwrap_or_default();
    match (sub.as_slice(), args.len()) {
        (b"SETNAME", 2) | (b"SETINFO", 3) => Reply::ok(),
        (b"SETNAME" | b"SETINFO", _) => wrong_args(&format!("client|{}", echo(&sub))),
        _ => Reply::err(format!(
            "ERR unknown subcommand '{}'. Try CLIENT HELP.",
            echo(&sub)
        )),
    }
}

/// The answer to `AUTH [user] password` (or HELLO's AUTH option) given the broker's
/// `token`: `None` when the client may go on, else the error to send, as Redis answers
/// (the token plays `requirepass`, the password of the `default` user). Never echoes
/// the password.
fn check(token: Option<&Token>, user: Option<&[u8]>, password: &[u8]) -> Option<Reply> {
    let wrongpass = || {
        Some(Reply::err(
            "WRONGPASS invalid username-password pair or user is disabled.",
        ))
    };
    match (token, user) {
        (None, None) => Some(Reply::err(
            "ERR AUTH <password> called without any password configured for the default user. Are you sure your configuration is correct?",
        )),
        // Redis's default user without a password accepts any password.
        (None, Some(b"default")) => None,
        (Some(token), None | Some(b"default")) if token.matches(password) => None,
        _ => wrongpass(),
    }
}

/// A token was given and was wrong (what [`check`] answers then).
fn is_wrongpass(reply: &Reply) -> bool {
    matches!(reply, Reply::Error(e) if e.starts_with("WRONGPASS"))
}

/// `QLIST.NEXT [count]`'s count (1 when absent); the broker checks its range.
fn parse_count(args: &[Vec<u8>]) -> Result<u64, Reply> {
    match args {
        [] => Ok(1),
        [count] => std::str::from_utf8(count)
            .ok()
            .and_then(|s| s.parse::<u64>().ok())
            .ok_or_else(|| Reply::err("ERR value is not an integer or out of range")),
        _ => Err(wrong_args("QLIST.NEXT")),
    }
}

fn wrong_args(name: &str) -> Reply {
    Reply::err(format!(
        "ERR wrong number of arguments for '{}' command",
        name.to_ascii_lowercase()
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    const RESP2: Session = Session {
        authenticated: true,
        proto: RespVersion::Resp2,
    };

    fn run(args: &[&str], session: &Session) -> Action {
        run_with(args, session, None)
    }

    fn run_with(args: &[&str], session: &Session, token: Option<&Token>) -> Action {
        let args: Vec<Vec<u8>> = args.iter().map(|a| a.as_bytes().to_vec()).collect();
        command(&args, session, &Stats::default(), token)
    }

    #[test]
    fn with_a_token_only_auth_hello_auth_and_quit_run_before_it() {
        let token = Token::new("s3cret").expect("token");
        let t = Some(&token);
        let locked = Session {
            authenticated: false,
            ..RESP2
        };
        let err = |a: Action| match a {
            Action::Reply(Reply::Error(e), None) | Action::Denied(Reply::Error(e)) => e,
            other => panic!("expected an error, got {other:?}"),
        };
        for args in [
            &["PING"][..],
            &["QLIST.NEXT"],
            &["QLIST.STATS"],
            &["SELECT", "0"],
        ] {
            assert_eq!(
                err(run_with(args, &locked, t)),
                "NOAUTH Authentication required."
            );
        }
        assert!(err(run_with(&["HELLO", "3"], &locked, t)).starts_with("NOAUTH HELLO"));
        assert_eq!(run_with(&["QUIT"], &locked, t), Action::Quit);
        for wrong in [
            &["AUTH", "nope"][..],
            &["AUTH", "default", "nope"],
            &["AUTH", "bob", "s3cret"],
        ] {
            let denied = run_with(wrong, &locked, t);
            assert!(matches!(denied, Action::Denied(_)), "{denied:?}");
            let e = err(denied);
            assert!(e.starts_with("WRONGPASS"), "{e}");
            assert!(!e.contains("nope") && !e.contains("s3cret"), "{e}");
        }
        let unlocked = Action::Unlock(Reply::ok(), None);
        assert_eq!(run_with(&["AUTH", "s3cret"], &locked, t), unlocked);
        assert_eq!(
            run_with(&["auth", "default", "s3cret"], &locked, t),
            unlocked
        );
        assert!(matches!(
            run_with(&["HELLO", "3", "AUTH", "default", "s3cret"], &locked, t),
            Action::Unlock(Reply::Map(_), Some(RespVersion::Resp3))
        ));
        assert!(err(run_with(
            &["HELLO", "3", "AUTH", "default", "x"],
            &locked,
            t
        ))
        .starts_with("WRONGPASS"));
        // Once authenticated, everything runs.
        assert_eq!(run_with(&["QLIST.NEXT"], &RESP2, t), Action::Next(1));
    }

    fn error(args: &[&str]) -> String {
        match run(args, &RESP2) {
            Action::Reply(Reply::Error(e), None) => e,
            other => panic!("{args:?}: expected an error, got {other:?}"),
        }
    }

    #[test]
    fn next_takes_an_optional_count_and_any_case() {
        assert_eq!(run(&["QLIST.NEXT"], &RESP2), Action::Next(1));
        assert_eq!(run(&["qlist.next", "42"], &RESP2), Action::Next(42));
        assert!(error(&["QLIST.NEXT", "-1"]).contains("not an integer"));
        assert!(error(&["QLIST.NEXT", "x"]).contains("not an integer"));
        assert!(error(&["QLIST.NEXT", "1", "2"]).contains("wrong number of arguments"));
        assert_eq!(run(&["quit"], &RESP2), Action::Quit);
    }

    #[test]
    fn hello_switches_versions_and_keeps_the_current_one_without_one() {
        let Action::Unlock(Reply::Map(fields), Some(RespVersion::Resp3)) =
            run(&["HELLO", "3"], &RESP2)
        else {
            panic!("HELLO 3 is a map that switches to RESP3");
        };
        assert!(fields.contains(&("server".into(), Reply::Bulk(b"qlist".to_vec()))));
        assert!(fields.contains(&("proto".into(), Reply::Int(3))));
        let resp3 = Session {
            proto: RespVersion::Resp3,
            ..RESP2
        };
        assert!(matches!(
            run(&["hello"], &resp3),
            Action::Unlock(_, Some(RespVersion::Resp3))
        ));
        assert!(error(&["HELLO", "4"]).starts_with("NOPROTO"));
        assert!(error(&["HELLO", "3", "AUTH", "bob", "pw"]).starts_with("WRONGPASS"));
    }

    #[test]
    fn auth_answers_as_redis_without_a_password() {
        let e = error(&["AUTH", "hunter2"]);
        assert!(e.contains("without any password configured"), "{e}");
        assert!(!e.contains("hunter2"), "never echoes the password");
        assert_eq!(
            run(&["AUTH", "default", "hunter2"], &RESP2),
            Action::Unlock(Reply::ok(), None)
        );
    }

    #[test]
    fn connect_time_commands_of_client_libraries_are_accepted() {
        let ok = Action::Reply(Reply::ok(), None);
        assert_eq!(run(&["CLIENT", "SETNAME", "app"], &RESP2), ok);
        assert_eq!(run(&["client", "setinfo", "LIB-NAME", "x"], &RESP2), ok);
        assert_eq!(run(&["SELECT", "0"], &RESP2), ok);
        assert!(error(&["SELECT", "1"]).contains("out of range"));
        assert!(error(&["CLIENT", "KILL", "x"]).contains("unknown subcommand 'KILL'"));
        assert!(error(&["CLIENT", "SETNAME"]).contains("wrong number of arguments"));
    }

    #[test]
    fn unknown_commands_are_named_safely() {
        assert_eq!(
            error(&["GET", "a\r\nb"]),
            "ERR unknown command 'GET', with args beginning with: 'a??b' "
        );
        assert!(error(&["PING", "a", "b"]).contains("wrong number of arguments for 'ping'"));
    }
}
