#!/usr/bin/env python3
"""Generate the per-run files of benches/load/run.sh into a temp directory.

    gen.py --dir DIR --keys N --d-port P --n1-port P --h1-port P --g-port P --g-admin-port P

Writes, from the templates beside this file:
  DIR/tollgate.yaml          tollgate.yaml with the picked ports and N pro keys appended
                             (`bench-key-00000`… as sha256 digests, names k00000…)
  DIR/tollgate-p3.yaml       the same with part three in force (Ga): the pro plan has a monthly
                             quota no run reaches, every generated key an `expires_at` (2099),
                             and every tenth key is rotated: the key sent is its `previous`
                             digest (until 2099), its `sha256` a newer one
  DIR/keys.map               nginx map lines `"Bearer <key>" <plan>;` (same keys, plain)
  DIR/nginx-d/nginx.conf     nginx/upstream.conf filled in (the upstream, setup D)
  DIR/nginx-n1/nginx.conf    nginx/policy.conf filled in (setup N1)
  DIR/nginx-n1log/nginx.conf the same with a buffered access log (setup N1-log)
  DIR/keys-digest.map        HAProxy map lines `<sha256 hex> <plan>` (same keys, digests)
  DIR/plan-limits.map        HAProxy map lines `<plan> <requests per 10 s>`
  DIR/haproxy-h1/haproxy.cfg haproxy/policy.cfg filled in (setup H1)
  DIR/wrk-<route>.lua        wrk scripts, one per route, rotating the N keys per request
  DIR/body-<route>.json      the route's request body (oha -D, curl)
  DIR/path-<route>           the route's path

Every key here is a public test key; nothing secret is generated.
"""

import argparse
import hashlib
import os
import re

HERE = os.path.dirname(os.path.abspath(__file__))

# route name -> (path, body). Both POST with Content-Type: application/json.
ROUTES = {
    "send_message": ("/v2/sendMessage/", '{"chatId":"1234@c.us","message":"hi"}'),
    "send_group_event": (
        "/v2/sendGroup",
        '{"name":"Standup","type":"event","groupId":"g-1","startTime":"2026-11-21T10:00:00.000Z",'
        '"eventOptions":{"callType":"voice","description":"Daily"}}',
    ),
}

# The plans' limits of tollgate.yaml (requests per 10 s), mirrored into the HAProxy map.
PLAN_LIMITS = [("basic", 40), ("standard", 70), ("pro", 150), ("bench", 1000000)]

# The fixed keys of tollgate.yaml (plain value, plan), mirrored into the nginx map.
FIXED_KEYS = [
    ("bench-fixed-key", "bench"),
    ("bench-basic-key", "basic"),
    ("bench-standard-key", "standard"),
]


# The expiry and rotation deadline of tollgate-p3.yaml's keys: in force, never reached.
FAR = "2099-01-01T00:00:00Z"


def key(i):
    # Five digits at least: bench-key-00042, bench-key-123456 (the wrk scripts and
    # instructions.sh's client spell them the same way).
    return "bench-key-%05d" % i


def lua_str(s):
    return '"' + s.replace("\\", "\\\\").replace('"', '\\"') + '"'


def write(path, text):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as f:
        f.write(text)


def write_haproxy(a, digest_map, limits_map):
    """haproxy/policy.cfg filled in (setup H1)."""
    prefix = os.path.join(a.dir, "haproxy-h1")
    with open(os.path.join(HERE, "haproxy", "policy.cfg")) as f:
        conf = f.read()
    for k, v in (
        ("@PREFIX@", prefix),
        ("@PORT@", str(a.h1_port)),
        ("@UPSTREAM_PORT@", str(a.d_port)),
        ("@KEYS_MAP@", digest_map),
        ("@PLAN_LIMITS@", limits_map),
    ):
        conf = conf.replace(k, v)
    left = re.findall(r"@[A-Z_]+@", conf)
    if left:
        raise SystemExit("policy.cfg: unfilled placeholders %s" % sorted(set(left)))
    write(os.path.join(prefix, "haproxy.cfg"), conf)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--dir", required=True)
    ap.add_argument("--keys", type=int, required=True)
    ap.add_argument("--d-port", type=int, required=True)
    ap.add_argument("--n1-port", type=int, required=True)
    ap.add_argument("--h1-port", type=int, default=0, help="0: no HAProxy config")
    ap.add_argument("--g-port", type=int, required=True)
    ap.add_argument("--g-admin-port", type=int, required=True)
    ap.add_argument("--zipf", type=float, default=0.0,
                    help="draw each request's key from Zipf(S) over the keys (the first key the "
                         "most frequent) instead of rotating them in order; 0: rotate")
    a = ap.parse_args()
    if not 1 <= a.keys <= 1000000:
        ap.error("--keys must be 1..1000000")

    # Tollgate config: substitute the three addresses, append the keys.
    with open(os.path.join(HERE, "tollgate.yaml")) as f:
        cfg = f.read()
    subs = [
        (r'^listen: ".*"$', 'listen: "127.0.0.1:%d"' % a.g_port),
        (r'^admin_listen: ".*"$', 'admin_listen: "127.0.0.1:%d"' % a.g_admin_port),
        (r'^  base_url: "[^"]*"', '  base_url: "http://127.0.0.1:%d"' % a.d_port),
    ]
    for pat, rep in subs:
        cfg, n = re.subn(pat, rep, cfg, count=1, flags=re.M)
        if n != 1:
            raise SystemExit("tollgate.yaml template: no line matches %r" % pat)
    top = [ln for ln in cfg.splitlines() if ln and not ln[0].isspace() and not ln.startswith("#")]
    if not top or top[-1].strip() != "keys:":
        raise SystemExit("tollgate.yaml template: `keys:` (block list) must be the last section")
    lines = [cfg.rstrip("\n"), "  # --- generated by gen.py: %d pro keys ---" % a.keys]
    for i in range(a.keys):
        digest = hashlib.sha256(key(i).encode()).hexdigest()
        lines.append('  - { name: k%05d, sha256: "%s", plan: pro }' % (i, digest))
    write(os.path.join(a.dir, "tollgate.yaml"), "\n".join(lines) + "\n")

    # The same, with part three in force (Ga): a quota, expiries, rotations.
    p3, n = re.subn(
        r"^  pro: \{(.*) \}$",
        r"  pro: {\1, quota: { requests: 1000000000, per: month } }",
        cfg.rstrip("\n"),
        count=1,
        flags=re.M,
    )
    if n != 1:
        raise SystemExit("tollgate.yaml template: no `  pro: { ... }` plan line")
    lines = [p3, "  # --- generated by gen.py: %d pro keys, part three ---" % a.keys]
    for i in range(a.keys):
        digest = hashlib.sha256(key(i).encode()).hexdigest()
        if i % 10 == 0:
            newer = hashlib.sha256((key(i) + "-rotated").encode()).hexdigest()
            lines.append(
                '  - { name: k%05d, sha256: "%s", plan: pro, expires_at: "%s",'
                ' previous: [{ sha256: "%s", until: "%s" }] }' % (i, newer, FAR, digest, FAR)
            )
        else:
            lines.append(
                '  - { name: k%05d, sha256: "%s", plan: pro, expires_at: "%s" }' % (i, digest, FAR)
            )
    write(os.path.join(a.dir, "tollgate-p3.yaml"), "\n".join(lines) + "\n")

    # nginx key map (N1).
    m = ['"Bearer %s" %s;' % (k, p) for k, p in FIXED_KEYS]
    m += ['"Bearer %s" pro;' % key(i) for i in range(a.keys)]
    keys_map = os.path.join(a.dir, "keys.map")
    write(keys_map, "\n".join(m) + "\n")

    # HAProxy maps (H1): digests, as Tollgate holds them.
    d = ["%s %s" % (hashlib.sha256(k.encode()).hexdigest(), p) for k, p in FIXED_KEYS]
    d += ["%s pro" % hashlib.sha256(key(i).encode()).hexdigest() for i in range(a.keys)]
    digest_map = os.path.join(a.dir, "keys-digest.map")
    write(digest_map, "\n".join(d) + "\n")
    limits_map = os.path.join(a.dir, "plan-limits.map")
    write(limits_map, "".join("%s %d\n" % pl for pl in PLAN_LIMITS))

    # nginx configs.
    for name, tmpl, port in (
        ("nginx-d", "upstream.conf", a.d_port),
        ("nginx-n1", "policy.conf", a.n1_port),
        ("nginx-n1log", "policy.conf", a.n1_port),
    ):
        prefix = os.path.join(a.dir, name)
        with open(os.path.join(HERE, "nginx", tmpl)) as f:
            conf = f.read()
        if name == "nginx-n1log":
            # N1-log: one line per request, buffered as operators run it.
            conf, n = re.subn(
                r"^    access_log off;$",
                "    access_log @PREFIX@/access.log combined buffer=64k flush=1s;",
                conf,
                flags=re.M,
            )
            if n != 1:
                raise SystemExit("policy.conf: no `access_log off;` line to turn on")
        for k, v in (
            ("@PREFIX@", prefix),
            ("@PORT@", str(port)),
            ("@UPSTREAM_PORT@", str(a.d_port)),
            ("@KEYS_MAP@", keys_map),
        ):
            conf = conf.replace(k, v)
        left = re.findall(r"@[A-Z_]+@", conf)
        if left:
            raise SystemExit("%s: unfilled placeholders %s" % (tmpl, sorted(set(left))))
        write(os.path.join(prefix, "nginx.conf"), conf)
        for d in ("body", "proxy", "fastcgi", "uwsgi", "scgi"):
            os.makedirs(os.path.join(prefix, d), exist_ok=True)

    # HAProxy config (H1).
    if a.h1_port:
        write_haproxy(a, digest_map, limits_map)

    # wrk scripts: all requests built once in init(), then one per call, keys in rotation (or,
    # with --zipf S, in an order drawn once in init() from Zipf(S): key k with weight 1 / k^S,
    # 2^20 draws by inverse CDF from a fixed seed, then replayed in a loop).
    pick = """function request()
  i = i % n + 1
  return reqs[i]
end"""
    if a.zipf > 0:
        pick = """local order, m = {}, 0
local function draw()
  local cdf, total = {}, 0
  for k = 1, n do
    total = total + 1 / k ^ %(s)r
    cdf[k] = total
  end
  math.randomseed(42)
  for j = 1, 1048576 do
    local u = math.random() * total
    local lo, hi = 1, n
    while lo < hi do
      local mid = math.floor((lo + hi) / 2)
      if cdf[mid] < u then lo = mid + 1 else hi = mid end
    end
    order[j] = lo
  end
  m = #order
end
function request()
  if m == 0 then draw() end
  i = i %% m + 1
  return reqs[order[i]]
end""" % {"s": a.zipf}
    for route, (path, body) in ROUTES.items():
        lua = """-- generated by benches/load/gen.py: POST %(path)s, %(n)d keys %(how)s
local n = %(n)d
local reqs = {}
local i = 0
function init(args)
  local body = %(body)s
  for k = 0, n - 1 do
    local h = {
      ["Host"] = wrk.headers["Host"],
      ["Content-Type"] = "application/json",
      ["Authorization"] = string.format("Bearer bench-key-%%05d", k),
    }
    reqs[k + 1] = wrk.format("POST", %(lpath)s, h, body)
  end
end
%(pick)s
-- PACE_MS in the environment (run.sh's PACES): every connection waits that long before each
-- request, so that the offered rate is about connections / (PACE_MS + the answer's time), the
-- same for every setup measured.
local pace = tonumber(os.getenv("PACE_MS") or "")
if pace and pace > 0 then
  function delay()
    return pace
  end
end
""" % {"path": path, "n": a.keys, "body": lua_str(body), "lpath": lua_str(path),
       "pick": pick, "how": "drawn Zipf(%r)" % a.zipf if a.zipf > 0 else "in rotation"}
        write(os.path.join(a.dir, "wrk-%s.lua" % route), lua)
        # For oha (-D FILE) and the sanity checks (curl --data-binary @FILE).
        write(os.path.join(a.dir, "body-%s.json" % route), body)
        write(os.path.join(a.dir, "path-%s" % route), path)


if __name__ == "__main__":
    main()
