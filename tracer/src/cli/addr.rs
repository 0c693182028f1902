//! `--serve HOST:PORT`, parsed by clap.

use std::{
    net::{IpAddr, Ipv4Addr, SocketAddr},
    path::PathBuf,
};

/// `--serve`'s argument as an address: `HOST:PORT` with HOST an IP address
/// or `localhost`; a bare `:PORT` is 127.0.0.1.
pub fn parse_addr(text: &str) -> Result<SocketAddr, String> {
    let bad = || {
        format!(
            "--serve takes HOST:PORT (e.g. 127.0.0.1:6060, [::1]:6060, or :6060 for \
             127.0.0.1:6060), got {text:?}"
        )
    };
    if let Some(port) = text.strip_prefix(':') {
        let port = port.parse::<u16>().map_err(|_| bad())?;
        return Ok(SocketAddr::new(IpAddr::V4(Ipv4Addr::LOCALHOST), port));
    }
    if let Some(port) = text.strip_prefix("localhost:") {
        let port = port.parse::<u16>().map_err(|_| bad())?;
        return Ok(SocketAddr::new(IpAddr::V4(Ipv4Addr::LOCALHOST), port));
    }
    text.parse::<SocketAddr>().map_err(|_| bad())
}

/// `--agent`'s argument: where a running agent listens.
#[derive(Clone, Debug, PartialEq)]
pub enum AgentAddress {
    Unix(PathBuf),
    Tcp(std::net::SocketAddr),
}

impl AgentAddress {
    /// A path (with a `/`) is the Unix socket; else HOST:PORT.
    pub fn parse(text: &str) -> Result<AgentAddress, String> {
        if text.contains('/') {
            return Ok(AgentAddress::Unix(PathBuf::from(text)));
        }
        parse_addr(text)
            .map(AgentAddress::Tcp)
            .map_err(|e| format!("--agent takes the agent's socket path or HOST:PORT: {e}"))
    }

    pub fn show(&self) -> String {
        match self {
            AgentAddress::Unix(path) => crate::escape::path(path),
            AgentAddress::Tcp(addr) => format!("http://{addr}"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn addresses() {
        let ok = |s: &str| parse_addr(s).map(|a| a.to_string());
        assert_eq!(ok(":6060"), Ok("127.0.0.1:6060".into()));
        assert_eq!(ok("localhost:0"), Ok("127.0.0.1:0".into()));
        assert_eq!(ok("0.0.0.0:80"), Ok("0.0.0.0:80".into()));
        assert_eq!(ok("[::1]:6060"), Ok("[::1]:6060".into()));
        for bad in [
            "",
            ":",
            "6060",
            ":65536",
            ":-1",
            "example.com:80",
            "1.2.3.4",
            "[::1]",
        ] {
            let err = parse_addr(bad).expect_err(bad);
            assert!(err.contains("HOST:PORT"), "{bad}: {err}");
        }
    }

    #[test]
    fn addresses_are_a_socket_path_or_host_and_port() {
        assert_eq!(
            AgentAddress::parse("/run/memtrace-bpf/agent.sock"),
            Ok(AgentAddress::Unix("/run/memtrace-bpf/agent.sock".into()))
        );
        assert_eq!(
            AgentAddress::parse(":6060"),
            Ok(AgentAddress::Tcp("127.0.0.1:6060".parse().unwrap()))
        );
        assert!(AgentAddress::parse("nonsense").is_err());
    }
}
