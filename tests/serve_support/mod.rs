//! Shared by the tests that run the `tollgate serve` program: a real process on a free
//! loopback port, the lines it writes to stderr, and plain HTTP/1.1 requests to it.

#![allow(dead_code)]

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::mpsc::{Receiver, channel};
use std::time::{Duration, Instant};

/// A `tollgate serve` process (killed when dropped) and the lines it writes to stderr.
pub struct Serve {
    pub child: Child,
    pub port: u16,
    said: Receiver<String>,
}

impl Drop for Serve {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Serve {
    /// Starts `tollgate serve` on `config` and waits until it listens; what it writes to
    /// stderr is echoed to the test's own and kept for [`said`](Self::said).
    pub fn start(config: &Path) -> Serve {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let mut child = Command::new(env!("CARGO_BIN_EXE_tollgate"))
            .args(["serve", "--config"])
            .arg(config)
            .args(["--listen", &format!("127.0.0.1:{port}")])
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("start tollgate serve");
        let mut out = BufReader::new(child.stdout.take().unwrap());
        let mut line = String::new();
        out.read_line(&mut line).unwrap();
        assert!(line.contains("listening"), "tollgate serve said: {line}");
        std::thread::spawn(move || std::io::copy(&mut out, &mut std::io::sink()));
        let (tx, said) = channel();
        let err = BufReader::new(child.stderr.take().unwrap());
        std::thread::spawn(move || {
            for line in err.lines().map_while(Result::ok) {
                eprintln!("{line}");
                let _ = tx.send(line);
            }
        });
        Serve { child, port, said }
    }

    /// The next stderr line that contains `what`, within 5 seconds.
    pub fn said(&self, what: &str) -> String {
        let deadline = Instant::now() + Duration::from_secs(5);
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.said.recv_timeout(left) {
                Ok(line) if line.contains(what) => return line,
                Ok(_) => {}
                Err(_) => panic!("tollgate serve did not say '{what}' within 5 s"),
            }
        }
    }

    /// The statuses of `n` requests for `path` (one connection each).
    pub fn statuses(&self, path: &str, n: usize) -> Vec<u16> {
        (0..n).map(|_| status(self.port, path)).collect()
    }
}

/// The status of `GET path` (one connection per request).
pub fn status(port: u16, path: &str) -> u16 {
    let mut s = TcpStream::connect(("127.0.0.1", port)).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n"
    )
    .unwrap();
    let mut reply = String::new();
    s.read_to_string(&mut reply).unwrap();
    reply
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or_else(|| panic!("no status in {reply:?}"))
}
