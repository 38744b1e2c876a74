//! Real `redis-server` processes on free loopback ports, started and stopped by the tests
//! themselves. Each guard kills exactly the process it started (by pid) when dropped, also when
//! the test panics.

#![allow(dead_code)]

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// A port no one listens on now (and, for a cluster node, whose bus port +10000 is free too).
pub fn free_port(cluster: bool) -> u16 {
    loop {
        let l = TcpListener::bind("127.0.0.1:0").expect("bind an ephemeral port");
        let p = l.local_addr().unwrap().port();
        drop(l);
        if !cluster {
            return p;
        }
        if p < 55_000 && TcpListener::bind(("127.0.0.1", p + 10_000)).is_ok() {
            return p;
        }
    }
}

/// Sends one inline command and returns the raw reply (enough for PING and INFO).
pub fn raw(port: u16, cmd: &str) -> Option<String> {
    let mut s = TcpStream::connect_timeout(
        &format!("127.0.0.1:{port}").parse().unwrap(),
        Duration::from_millis(200),
    )
    .ok()?;
    s.set_read_timeout(Some(Duration::from_millis(500))).ok()?;
    s.write_all(format!("{cmd}\r\n").as_bytes()).ok()?;
    let mut buf = vec![0u8; 64 * 1024];
    let n = s.read(&mut buf).ok()?;
    Some(String::from_utf8_lossy(&buf[..n]).into_owned())
}

/// A `redis-server` child process.
pub struct RedisServer {
    pub port: u16,
    child: Option<Child>,
    dir: PathBuf,
    extra: Vec<String>,
}

impl RedisServer {
    /// Starts a standalone server with no persistence.
    pub fn start() -> RedisServer {
        Self::start_with(&[])
    }

    /// Starts a standalone server on a given port (one chosen by `free_port` earlier).
    pub fn start_at(port: u16) -> RedisServer {
        let mut s = Self::unstarted(port, &[]);
        assert!(s.spawn(), "redis-server did not start on port {port}");
        s
    }

    /// A server on `port` with a fresh, empty working directory, not yet running.
    fn unstarted(port: u16, extra: &[&str]) -> RedisServer {
        let dir =
            std::env::temp_dir().join(format!("tollgate-redis-{}-{port}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        RedisServer {
            port,
            child: None,
            dir,
            extra: extra.iter().map(|s| s.to_string()).collect(),
        }
    }

    /// Starts a server with extra arguments (e.g. cluster mode).
    pub fn start_with(extra: &[&str]) -> RedisServer {
        let cluster = extra.contains(&"--cluster-enabled");
        for _ in 0..5 {
            let mut s = Self::unstarted(free_port(cluster), extra);
            if s.spawn() {
                return s;
            }
        }
        panic!("could not start redis-server (is it installed? scripts/test.sh installs it)");
    }

    fn spawn(&mut self) -> bool {
        let child = Command::new("redis-server")
            .args(["--port", &self.port.to_string()])
            .args(["--bind", "127.0.0.1"])
            .args(["--save", ""])
            .args(["--appendonly", "no"])
            .args(["--dir", self.dir.to_str().unwrap()])
            .args(&self.extra)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("redis-server must be installed (scripts/test.sh installs it)");
        self.child = Some(child);
        let t = Instant::now();
        while t.elapsed() < Duration::from_secs(5) {
            if raw(self.port, "PING").is_some_and(|r| r.starts_with("+PONG")) {
                return true;
            }
            if let Some(Ok(Some(_))) = self.child.as_mut().map(|c| c.try_wait()) {
                break; // exited (port taken?)
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        self.kill();
        false
    }

    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}/", self.port)
    }

    pub fn pid(&self) -> u32 {
        self.child.as_ref().expect("running").id()
    }

    fn signal(&self, sig: &str) {
        let ok = Command::new("kill")
            .args([sig, &self.pid().to_string()])
            .status()
            .expect("kill")
            .success();
        assert!(ok, "kill {sig} failed");
    }

    /// SIGKILL, and reap.
    pub fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// SIGSTOP: the process keeps its sockets but answers nothing.
    pub fn pause(&self) {
        self.signal("-STOP");
    }

    /// SIGCONT.
    pub fn resume(&self) {
        self.signal("-CONT");
    }

    /// Starts it again on the same port (after `kill` or a SHUTDOWN), with empty data.
    pub fn restart(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.wait();
        }
        let t = Instant::now();
        while t.elapsed() < Duration::from_secs(10) {
            if self.spawn() {
                return;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        panic!("redis-server did not restart on port {}", self.port);
    }

    /// Waits for the process to exit by itself (after SHUTDOWN).
    pub fn wait_exit(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.wait();
        }
    }

    /// `redis-cli` against this server; returns stdout.
    pub fn cli(&self, args: &[&str]) -> String {
        let out = Command::new("redis-cli")
            .args(["-p", &self.port.to_string()])
            .args(args)
            .output()
            .expect("redis-cli");
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// A field of `INFO`.
    pub fn info(&self, field: &str) -> Option<u64> {
        let info = self.cli(&["INFO"]);
        info.lines()
            .find_map(|l| l.strip_prefix(&format!("{field}:")))
            .and_then(|v| v.trim().parse().ok())
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        if self.child.is_some() {
            // A paused process cannot die of SIGKILL any slower, but make sure it is not stopped.
            let _ = Command::new("kill")
                .args(["-CONT", &self.pid().to_string()])
                .status();
        }
        self.kill();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// A 3-master Redis Cluster on loopback, made with `redis-cli --cluster create`.
pub struct RedisCluster {
    pub nodes: Vec<RedisServer>,
}

impl RedisCluster {
    pub fn start() -> RedisCluster {
        let nodes: Vec<RedisServer> = (0..3)
            .map(|_| {
                RedisServer::start_with(&[
                    "--cluster-enabled",
                    "yes",
                    "--cluster-config-file",
                    "nodes.conf",
                    "--cluster-node-timeout",
                    "2000",
                ])
            })
            .collect();
        let addrs: Vec<String> = nodes
            .iter()
            .map(|n| format!("127.0.0.1:{}", n.port))
            .collect();
        let out = Command::new("redis-cli")
            .args(["--cluster", "create"])
            .args(&addrs)
            .args(["--cluster-replicas", "0", "--cluster-yes"])
            .output()
            .expect("redis-cli --cluster create");
        assert!(
            out.status.success(),
            "cluster create failed: {}",
            String::from_utf8_lossy(&out.stdout)
        );
        let t = Instant::now();
        loop {
            let ok = nodes
                .iter()
                .all(|n| n.cli(&["CLUSTER", "INFO"]).contains("cluster_state:ok"));
            if ok {
                break;
            }
            assert!(
                t.elapsed() < Duration::from_secs(20),
                "cluster never became ok"
            );
            std::thread::sleep(Duration::from_millis(100));
        }
        RedisCluster { nodes }
    }

    pub fn urls(&self) -> Vec<String> {
        self.nodes.iter().map(|n| n.url()).collect()
    }
}
