//! Where the ranks of a job meet: `master_addr` must resolve, and `master_port` be free for
//! the rendezvous store that rank 0 (or node 0's launcher) binds.
use std::net::TcpListener;
use std::time::Duration;

use crate::error::{Error, Result};

/// What node `node_rank` (> 0) of a job of several nodes should hear when its `master_addr`
/// names this very machine (the default, 127.0.0.1): node 0 must then run here too, else this
/// node waits `dist_timeout` for a store that is not here.
pub fn loopback_warning(addr: &str, node_rank: usize) -> Option<String> {
    let loopback = addr.eq_ignore_ascii_case("localhost")
        || addr
            .parse::<std::net::IpAddr>()
            .is_ok_and(|ip| ip.is_loopback());
    (loopback && node_rank > 0).then(|| {
        format!(
            "warning: master_addr={addr} names this machine: node {node_rank} reaches node 0 only \
             if node 0 runs here too; on a cluster give node 0's host name or address"
        )
    })
}

/// Whether `addr` names this machine: one of the addresses it resolves to can be bound here.
pub fn names_this_machine(addr: &str) -> bool {
    use std::net::ToSocketAddrs;
    (addr, 0)
        .to_socket_addrs()
        .is_ok_and(|mut all| all.any(|at| TcpListener::bind(at).is_ok()))
}

/// Whether a connection to `addr:port` comes back to this machine (a NAT, a service address or
/// a public address that leads here): a listener this process holds on every interface at
/// `port` takes it, and reads the token it sent. None when it cannot be told (the port is
/// taken, the name does not resolve just now).
fn leads_here(addr: &str, port: u16) -> Option<bool> {
    use std::io::{Read, Write};
    use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, TcpStream, ToSocketAddrs};
    let token = format!(
        "tdmpc2 {} {:?}",
        std::process::id(),
        std::time::Instant::now()
    );
    for at in (addr, port).to_socket_addrs().ok()? {
        let every_interface: IpAddr = match at {
            std::net::SocketAddr::V4(_) => Ipv4Addr::UNSPECIFIED.into(),
            std::net::SocketAddr::V6(_) => Ipv6Addr::UNSPECIFIED.into(),
        };
        let listener = TcpListener::bind((every_interface, port)).ok()?;
        listener.set_nonblocking(true).ok()?;
        // Held open until the listener has looked: a proxy may pass it on only then.
        let Ok(mut sent) = TcpStream::connect_timeout(&at, Duration::from_secs(2)) else {
            continue;
        };
        let _ = sent.write_all(token.as_bytes());
        let asked = std::time::Instant::now();
        while asked.elapsed() < Duration::from_secs(1) {
            if let Ok((mut taken, _)) = listener.accept() {
                let mut read = vec![0; token.len()];
                let _ = taken.set_nonblocking(false);
                let _ = taken.set_read_timeout(Some(Duration::from_millis(500)));
                // Another connection (a port scan, say) is not the one sent.
                if taken.read_exact(&mut read).is_ok() && read == token.as_bytes() {
                    return Some(true);
                }
                continue;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }
    Some(false)
}

/// Node 0 hosts the job's store at `master_addr:port`, so it should lead to node 0's machine.
/// With one node every rank runs here, and an address that leads to another machine is
/// refused (its ranks would wait `dist_timeout` for a store that is not there). With several,
/// one that no interface here has is a warning (the others' way to it may lead here), and is
/// not tried: a listener on the port would answer the other nodes before the store does.
pub fn check_node_0_hosts(addr: &str, port: u16, nnodes: usize) -> Result<Option<String>> {
    if names_this_machine(addr) {
        return Ok(None);
    }
    match nnodes {
        1 if leads_here(addr, port) == Some(false) => Err(Error::Config(format!(
            "master_addr={addr} leads to another machine, but nnodes=1 runs every rank here, \
             around a store on this machine: leave master_addr at its default (127.0.0.1) or \
             name this machine"
        ))),
        1 => Ok(None),
        _ => Ok(Some(format!(
            "warning: master_addr={addr} is no address of this machine, yet this is node 0, \
             which hosts the job's store: the other nodes reach it only if {addr} leads here \
             from them"
        ))),
    }
}

/// Every node meets at `master_addr`: a name that does not resolve is refused at once, where
/// the store would retry it until dist_timeout and torch print its C++ frames on the way.
/// A resolver that fails for the time being (EAI_AGAIN: DNS not yet serving node 0's name, as
/// on a cluster still coming up) is asked again until `limit`, then the run fails (exit 1,
/// restartable); a name the resolver does not know is bad input. `given` says how `addr` was
/// given, for the errors (`master_addr=ADDR`, or `MASTER_ADDR=ADDR` from torchrun or SLURM).
pub fn check_master_resolves(given: &str, addr: &str, port: u16, limit: Duration) -> Result<()> {
    use std::net::ToSocketAddrs;
    let deadline = envs::deadline::Deadline::after(limit);
    loop {
        let e = match (addr, port).to_socket_addrs().map(|mut addrs| addrs.next()) {
            Ok(Some(_)) => return Ok(()),
            Ok(None) => {
                return Err(Error::Config(format!(
                    "{given} resolves to no address: give node 0's address or host \
                     name"
                )))
            }
            Err(e) => e,
        };
        // glibc's words for EAI_AGAIN (libtorch builds against glibc).
        let for_now = e.to_string().contains("Temporary failure");
        if !for_now {
            return Err(Error::Config(format!(
                "{given} cannot be resolved ({e}): give node 0's address or host name"
            )));
        }
        if deadline.passed() {
            return Err(Error::Other(format!(
                "{given} could not be resolved within {} s (dist_timeout): {e}",
                limit.as_secs()
            )));
        }
        std::thread::sleep(Duration::from_secs(2));
    }
}

/// Whether anything accepts a connection at `addr:port` within `within`: a client asks this
/// before it asks c10d's store to connect, which prints a warning with some 30 lines of C++
/// frames for every try that finds nothing there (thousands of lines while a node or a rank
/// waits for the host to come up). A store tolerates the bare connection.
pub fn answers(addr: &str, port: u16, within: Duration) -> bool {
    use std::net::{TcpStream, ToSocketAddrs};
    let Ok(addrs) = (addr, port).to_socket_addrs() else {
        return false;
    };
    addrs
        .into_iter()
        .any(|at| TcpStream::connect_timeout(&at, within).is_ok())
}

/// Waits (briefly) for the last attempt's rendezvous store to let go of master_port.
pub fn wait_for_port(addr: &str, port: u16) -> Result<()> {
    let started = std::time::Instant::now();
    loop {
        match check_port_free(addr, port) {
            Err(e) if started.elapsed() > Duration::from_secs(30) => return Err(e),
            Err(_) => std::thread::sleep(Duration::from_millis(200)),
            Ok(()) => return Ok(()),
        }
    }
}

/// Rank 0's rendezvous store binds master_port: fail now, clearly, rather than hang later.
pub fn check_port_free(addr: &str, port: u16) -> Result<()> {
    let local = matches!(addr, "127.0.0.1" | "localhost" | "0.0.0.0" | "::1");
    let bind_addr = if local { "127.0.0.1" } else { "0.0.0.0" };
    TcpListener::bind((bind_addr, port)).map(drop).map_err(|e| {
        Error::Config(format!(
            "master_port={port} is not free on this machine ({e}); pick another with master_port=PORT"
        ))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_later_node_told_to_meet_at_this_machine_is_warned() {
        for addr in ["127.0.0.1", "localhost", "::1", "127.0.1.1"] {
            let warning = loopback_warning(addr, 1).unwrap_or_default();
            assert!(warning.contains(&format!("master_addr={addr} names this machine")));
            assert_eq!(loopback_warning(addr, 0), None, "node 0 hosts it");
        }
        assert_eq!(loopback_warning("10.0.0.7", 1), None);
        assert_eq!(loopback_warning("node-a.cluster", 3), None);
    }

    #[test]
    fn node_0_must_be_where_master_addr_leads() {
        let port = TcpListener::bind(("127.0.0.1", 0))
            .and_then(|l| l.local_addr())
            .unwrap()
            .port();
        for here in ["127.0.0.1", "localhost", "0.0.0.0"] {
            assert!(names_this_machine(here), "{here}");
            assert_eq!(check_node_0_hosts(here, port, 1).unwrap(), None);
        }
        // TEST-NET-1 (RFC 5737): documentation only, on no machine.
        let elsewhere = "192.0.2.1";
        assert!(!names_this_machine(elsewhere));
        assert_eq!(leads_here(elsewhere, port), Some(false));
        let e = check_node_0_hosts(elsewhere, port, 1).unwrap_err();
        assert!(matches!(e, Error::Config(_)), "{e}");
        let e = e.to_string();
        assert!(
            e.contains("master_addr=192.0.2.1 leads to another machine"),
            "{e}"
        );
        let warning = check_node_0_hosts(elsewhere, port, 2).unwrap();
        let warning = warning.unwrap_or_default();
        assert!(
            warning.starts_with("warning: master_addr=192.0.2.1"),
            "{warning}"
        );
        // An address that leads here, though no interface need have it, as a NAT's would.
        assert_eq!(leads_here("127.0.0.1", port), Some(true));
        // Unknown while the port is taken.
        let taken = TcpListener::bind(("0.0.0.0", port)).unwrap();
        assert_eq!(leads_here(elsewhere, port), None);
        drop(taken);
    }

    #[test]
    fn a_port_answers_only_while_something_listens_there() {
        let listener = TcpListener::bind(("127.0.0.1", 0)).unwrap();
        let port = listener.local_addr().unwrap().port();
        let within = Duration::from_secs(1);
        assert!(answers("127.0.0.1", port, within));
        assert!(answers("localhost", port, within));
        drop(listener);
        assert!(!answers("127.0.0.1", port, within));
        assert!(!answers("not..a.host", port, within));
    }

    #[test]
    fn a_master_addr_that_does_not_resolve_is_refused() {
        let limit = Duration::from_secs(1);
        check_master_resolves("master_addr=127.0.0.1", "127.0.0.1", 29500, limit).unwrap();
        check_master_resolves("master_addr=localhost", "localhost", 29500, limit).unwrap();
        for named in ["master_addr", "MASTER_ADDR"] {
            let given = format!("{named}=not..a.host");
            let e = check_master_resolves(&given, "not..a.host", 29500, limit).unwrap_err();
            assert!(matches!(e, Error::Config(_)), "{e}");
            assert!(
                e.to_string()
                    .contains(&format!("{named}=not..a.host cannot be resolved")),
                "{e}"
            );
        }
    }
}
