//! A real DNS server (dnsmasq, from Debian: xtask/src/packages.rs) answering from a hosts
//! file the test writes, with a TTL of one second; the test changes the answers
//! ([`Dns::answer`]) or stops the server ([`Dns::stop`]).

use std::net::{IpAddr, SocketAddr};
use std::os::unix::fs::PermissionsExt;
use std::process::{Child, Command, Stdio};

use super::{free_port, loopback, signal, wait_until, which};

pub struct Dns {
    pub addr: SocketAddr,
    child: Option<Child>,
    dir: tempfile::TempDir,
}

impl Dns {
    /// A server answering each of `records` (name, address), on a free loopback port.
    pub fn start(records: &[(&str, IpAddr)]) -> Dns {
        let dir = tempfile::tempdir().unwrap();
        // dnsmasq reads the file again as the user it dropped to.
        std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
        let addr = loopback(free_port());
        let mut dns = Dns {
            addr,
            child: None,
            dir,
        };
        dns.write(records);
        let log = dns.dir.path().join("dnsmasq.log");
        let child = Command::new(which("dnsmasq"))
            .args([
                "--keep-in-foreground",
                "--no-resolv",
                "--no-hosts",
                "--bind-interfaces",
            ])
            .args([
                "--listen-address=127.0.0.1",
                "--local-ttl=1",
                "--pid-file=",
                "--user=root",
            ])
            .arg(format!("--port={}", addr.port()))
            .arg(format!("--addn-hosts={}", dns.hosts().display()))
            .arg(format!("--log-facility={}", log.display()))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("dnsmasq runs");
        dns.child = Some(child);
        wait_until("dnsmasq to read its hosts file", || {
            std::fs::read_to_string(&log).is_ok_and(|l| l.contains("read "))
        });
        dns
    }

    fn hosts(&self) -> std::path::PathBuf {
        self.dir.path().join("hosts")
    }

    fn write(&self, records: &[(&str, IpAddr)]) {
        let text: String = records
            .iter()
            .map(|(name, ip)| format!("{ip} {name}\n"))
            .collect();
        super::replace_file(&self.hosts(), &text);
        std::fs::set_permissions(self.hosts(), std::fs::Permissions::from_mode(0o644)).unwrap();
    }

    /// Answers `records` from now on (dnsmasq reads its hosts file again on SIGHUP).
    pub fn answer(&self, records: &[(&str, IpAddr)]) {
        self.write(records);
        signal(self.child.as_ref().unwrap().id(), "HUP");
    }

    /// Stops the server: its port answers nothing.
    pub fn stop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

impl Drop for Dns {
    fn drop(&mut self) {
        self.stop();
    }
}
