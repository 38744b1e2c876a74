"""Conformance of `tollgate rls` through clients the project did not write: grpcio with the
Envoy stubs of the xds-protos package, and urllib for the HTTP port. Run by
scripts/rls-conformance.sh, which starts the server; every assertion is an exact value."""

import json
import os
import shutil
import signal
import sys
import time
import urllib.error
import urllib.request

import grpc
from envoy.extensions.common.ratelimit.v3 import ratelimit_pb2 as common
from envoy.service.ratelimit.v3 import rls_pb2, rls_pb2_grpc
from google.protobuf import wrappers_pb2

GRPC_ADDR, HTTP_ADDR, CONFIG_DIR, PID = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
OK = rls_pb2.RateLimitResponse.OK
OVER = rls_pb2.RateLimitResponse.OVER_LIMIT
HOUR = rls_pb2.RateLimitResponse.RateLimit.HOUR
DAY = rls_pb2.RateLimitResponse.RateLimit.DAY
RUN = str(os.getpid())  # fresh values per run, so a rerun on a warm server starts clean

channel = grpc.insecure_channel(GRPC_ADDR)
stub = rls_pb2_grpc.RateLimitServiceStub(channel)
checks = 0


def check(cond, what):
    global checks
    checks += 1
    if not cond:
        raise AssertionError(what)


def desc(*entries, hits=None):
    d = common.RateLimitDescriptor(
        entries=[common.RateLimitDescriptor.Entry(key=k, value=v) for k, v in entries]
    )
    if hits is not None:
        d.hits_addend.CopyFrom(wrappers_pb2.UInt64Value(value=hits))
    return d


def ask(domain, *descriptors, hits=0):
    req = rls_pb2.RateLimitRequest(domain=domain, descriptors=descriptors, hits_addend=hits)
    return stub.ShouldRateLimit(req, timeout=5)


def status(resp, i=0):
    s = resp.statuses[i]
    return (s.code, s.current_limit.requests_per_unit, s.limit_remaining)


def http(method, path, body=None):
    req = urllib.request.Request(f"http://{HTTP_ADDR}{path}", data=body, method=method)
    try:
        with urllib.request.urlopen(req, timeout=5) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


def metric(name, **labels):
    _, text = http("GET", "/metrics")
    want = ",".join(f'{k}="{v}"' for k, v in labels.items())
    prefix = f"{name}{{{want}}} " if labels else f"{name} "
    for line in text.splitlines():
        if line.startswith(prefix):
            return int(line.split()[-1])
    return None


def counting():
    user = ("user", "u" + RUN)
    for left in (2, 1, 0):
        r = ask("api", desc(user))
        check(r.overall_code == OK and status(r) == (OK, 3, left), f"user ok {left}: {r}")
        s = r.statuses[0]
        check(s.current_limit.unit == HOUR, "unit HOUR")
        check(0 < s.duration_until_reset.seconds <= 3600, "reset within the hour")
        check(s.duration_until_reset.seconds == 3600 - int(time.time()) % 3600
              or s.duration_until_reset.seconds == 3600 - (int(time.time()) - 1) % 3600,
              "reset aligned to the Unix hour")
    r = ask("api", desc(user))
    check(r.overall_code == OVER and status(r) == (OVER, 3, 0), f"4th over: {r}")
    # Another value of the same key-only entry has its own counter.
    r = ask("api", desc(("user", "other" + RUN)))
    check(status(r) == (OK, 3, 2), "another user")


def hits_addend():
    t = ("tenant", "t" + RUN)
    r = ask("api", desc(t), hits=4)
    check(status(r) == (OK, 10, 6), f"hits 4: {r}")
    check(r.statuses[0].current_limit.unit == DAY, "unit DAY")
    r = ask("api", desc(t), hits=7)  # 4 + 7 = 11 > 10: over, and counted (upstream INCRBYs)
    check(status(r) == (OVER, 10, 0), f"hits 7 over: {r}")
    r = ask("api", desc(t, hits=0))  # a check that adds nothing: still over (count 11)
    check(status(r) == (OVER, 10, 0), f"hits 0 after over: {r}")
    r = ask("api", desc(t), hits=1)  # one more: over (a denial consumed what was left)
    check(status(r) == (OVER, 10, 0), "over stays over")
    t2 = ("tenant", "t2" + RUN)
    r = ask("api", desc(t2, hits=10), hits=3)  # the descriptor's hits_addend wins
    check(status(r) == (OK, 10, 0), f"descriptor hits 10: {r}")
    r = ask("api", desc(t2, hits=0))  # count == limit: OK, nothing left
    check(status(r) == (OK, 10, 0), f"hits 0 at the limit: {r}")
    t3 = ("tenant", "t3" + RUN)
    r = ask("api", desc(t3, hits=0))
    check(status(r) == (OK, 10, 10), f"hits 0 fresh: {r}")
    r = ask("api", desc(t3, hits=11))
    check(status(r) == (OVER, 10, 0), "more hits than the limit")


def matching():
    r = ask("api", desc(("plan", "free"), ), desc(("plan", "pro")))
    check(status(r, 0) == (OK, 2, 1) and status(r, 1) == (OK, 5, 4), f"key-value vs key: {r}")
    r = ask("api", desc(("path", "/static/" + RUN)))
    check(status(r) == (OK, 1, 0), f"wildcard: {r}")
    r = ask("api", desc(("path", "/static/" + RUN)))
    check(status(r) == (OVER, 1, 0), "wildcard over")
    r = ask("api", desc(("path", "/api")))
    check(status(r) == (OK, 0, 0) and not r.statuses[0].HasField("current_limit"), "no match")
    r = ask("api", desc(("route", "checkout"), ("user", "n" + RUN)))
    check(status(r) == (OK, 2, 1), f"nested: {r}")
    r = ask("api", desc(("route", "checkout")))
    check(status(r) == (OK, 0, 0) and not r.statuses[0].HasField("current_limit"), "partial path")
    r = ask("nowhere", desc(("user", "x")))
    check(r.overall_code == OK and len(r.statuses) == 1 and status(r) == (OK, 0, 0), "unknown domain")
    r = ask("api", desc(("internal", "x")))
    check(status(r) == (OK, 0, 4294967295) and not r.statuses[0].HasField("current_limit"),
          f"unlimited: {r}")
    r = ask("api", desc(("banned", "x")))
    check(r.overall_code == OVER and status(r) == (OVER, 0, 0), "limit 0")
    # Several descriptors: the overall code is over if any is.
    r = ask("api", desc(("internal", "y")), desc(("banned", "y")), desc(("plan", "x" + RUN)))
    check([s.code for s in r.statuses] == [OK, OVER, OK] and r.overall_code == OVER, "overall")


def shadow_and_replaces():
    trial = ("trial", "s" + RUN)
    check(status(ask("api", desc(trial))) == (OK, 1, 0), "shadow first")
    r = ask("api", desc(trial))
    check(r.overall_code == OK and status(r) == (OK, 1, 0), f"shadow answers OK: {r}")
    check(metric("ratelimit_service_rate_limit_shadow_mode", domain="api", key1="trial") >= 1,
          "shadow_mode counted")
    g = ("global", "g" + RUN)
    check(status(ask("api", desc(g))) == (OK, 1, 0), "global alone")
    r = ask("api", desc(g), desc(("vip", "v" + RUN)))
    check(r.overall_code == OK, f"replaced: {r}")
    check(status(r, 0) == (OK, 0, 0) and not r.statuses[0].HasField("current_limit"),
          "the replaced limit is not applied")
    check(status(r, 1) == (OK, 100, 99), "the replacing limit applies")


def errors():
    for req, what in [
        (rls_pb2.RateLimitRequest(domain="", descriptors=[desc(("a", "b"))]), "empty domain"),
        (rls_pb2.RateLimitRequest(domain="api"), "no descriptors"),
    ]:
        try:
            stub.ShouldRateLimit(req, timeout=5)
            check(False, what)
        except grpc.RpcError as e:
            check(e.code() == grpc.StatusCode.UNKNOWN, f"{what}: {e.code()}")


def http_port():
    code, body = http("GET", "/healthcheck")
    check(code == 200 and body == "OK", "healthcheck")
    b = json.dumps({"domain": "api", "descriptors": [{"entries": [{"key": "user", "value": "j" + RUN}]}]}).encode()
    for left in (2, 1, 0):
        code, body = http("POST", "/json", b)
        got = json.loads(body)
        want_left = {"limitRemaining": left} if left else {}
        check(code == 200 and got["overallCode"] == "OK", f"json ok: {body}")
        s = got["statuses"][0]
        check(s["code"] == "OK" and s["currentLimit"] == {"requestsPerUnit": 3, "unit": "HOUR"}
              and s.get("limitRemaining", 0) == left and s["durationUntilReset"].endswith("s"),
              f"json status: {body} {want_left}")
    code, body = http("POST", "/json", b)
    check(code == 429 and json.loads(body)["overallCode"] == "OVER_LIMIT", f"json 429: {code}")
    code, _ = http("POST", "/json", b"{not json")
    check(code == 400, "bad json is 400")
    # Stats as upstream counts them, as deltas (the counters are per config entry, shared by
    # every run): 5 hits on a limit of 3 (near threshold 2): 3 within, 2 over, 1 near.
    names = ("total_hits", "within_limit", "over_limit", "near_limit", "shadow_mode")
    def user_stats():
        return [metric(f"ratelimit_service_rate_limit_{n}", domain="api", key1="user") or 0 for n in names]
    before = user_stats()
    for _ in range(5):
        ask("api", desc(("user", "m" + RUN)))
    after = user_stats()
    check([a - b for a, b in zip(after, before)] == [5, 3, 2, 1, 0], f"stats deltas: {before} -> {after}")
    # The standard gRPC health service (raw bytes: an empty HealthCheckRequest; SERVING = 1).
    health = channel.unary_unary("/grpc.health.v1.Health/Check")
    check(health(b"", timeout=5) == b"\x08\x01", "grpc health: SERVING")
    check(health(b"\x0a\x2benvoy.service.ratelimit.v3.RateLimitService", timeout=5) == b"\x08\x01",
          "grpc health of the rate limit service: SERVING")


def wait_for(cond, what, seconds=5.0):
    end = time.time() + seconds
    while time.time() < end:
        if cond():
            return
        time.sleep(0.1)
    check(False, f"{what} not in effect within {seconds} s")


def reload():
    path = os.path.join(CONFIG_DIR, "reload.yaml")
    k = ("k", "r" + RUN)
    check(status(ask("reload", desc(k))) == (OK, 2, 1), "reload: before")
    # Modified in place: the limit rises to 5 (a new rate: counted afresh); the other file's
    # counters are kept.
    other = ("user", "keep" + RUN)
    check(status(ask("api", desc(other))) == (OK, 3, 2), "api before the reload")
    with open(path, "w") as f:
        f.write("domain: reload\ndescriptors:\n  - key: k\n    rate_limit: {unit: hour, requests_per_unit: 5}\n")
    wait_for(lambda: status(ask("reload", desc(k, hits=0)))[1] == 5, "modify in place")
    got = status(ask("reload", desc(k)))
    check(got == (OK, 5, 4), f"a new rate counts afresh: {got}")
    check(status(ask("api", desc(other))) == (OK, 3, 1), "unchanged limits keep their counters")
    # A bad file: the old config stays.
    with open(path, "w") as f:
        f.write("domain: reload\ndescriptors:\n  - key: k\n    rate_limit: {unit: fortnight, requests_per_unit: 1}\n")
    time.sleep(2.5)
    check(status(ask("reload", desc(k, hits=0))) == (OK, 5, 4), "bad file keeps the old config")
    check(metric("ratelimit_service_config_load_error") >= 1, "config_load_error counted")
    # Replaced by a rename.
    tmp = os.path.join(CONFIG_DIR, ".reload.tmp")
    with open(tmp, "w") as f:
        f.write("domain: reload\ndescriptors:\n  - key: k\n    rate_limit: {unit: hour, requests_per_unit: 4}\n")
    os.rename(tmp, path)
    wait_for(lambda: status(ask("reload", desc(k, hits=0)))[1] == 4, "replace by rename")
    check(status(ask("reload", desc(k))) == (OK, 4, 3), "in effect after the rename")
    check(status(ask("api", desc(other))) == (OK, 3, 0), "counters kept across the rename")
    # A file added, then removed.
    added = os.path.join(CONFIG_DIR, "added.yml")
    with open(added, "w") as f:
        f.write("domain: added\ndescriptors:\n  - key: a\n    rate_limit: {unit: hour, requests_per_unit: 1}\n")
    wait_for(lambda: status(ask("added", desc(("a", "x" + RUN), hits=0))) == (OK, 1, 1), "file added")
    os.remove(added)
    wait_for(lambda: status(ask("added", desc(("a", "x" + RUN)))) == (OK, 0, 0), "file removed")


def shutdown():
    os.kill(PID, signal.SIGTERM)
    end = time.time() + 10
    while time.time() < end:
        try:
            pid, st = os.waitpid(PID, os.WNOHANG)
        except ChildProcessError:
            return  # not our child: the script checks its exit status
        if pid:
            check(os.WEXITSTATUS(st) == 0, "exit 0 on SIGTERM")
            return
        time.sleep(0.1)


for test in (counting, hits_addend, matching, shadow_and_replaces, errors, http_port, reload):
    test()
    print(f"ok  {test.__name__}")
print(f"rls conformance: {checks} checks passed")
