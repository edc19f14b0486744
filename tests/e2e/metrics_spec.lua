-- Metrics, the admin listener's /metrics and the access log's retry story, end to end: the real binary with
-- worker_processes 2 and an admin listener, in front of tests/tools/fault_upstream.lua (plus a closed port, an LMDB
-- idempotency store, a route script that fails and a TLS listener). Every count is checked exactly, as the
-- difference between two scrapes around a known sequence of requests, so the specs do not depend on their order.
package.path = "tests/e2e/?.lua;" .. package.path
local H = require("helpers")
local json = require("cjson")
local socket = require("socket")

local ctx = H.context

---------------------------------------------------------------------------
-- Prometheus text -> { [series key] = value }, the key being name{label="value",...} with labels sorted by name,
-- so expectations need not know the order the gateway prints them in.
---------------------------------------------------------------------------

local function key(name, labels)
    local names = {}
    for k in pairs(labels or {}) do names[#names + 1] = k end
    if #names == 0 then return name end
    table.sort(names)
    local parts = {}
    for i, k in ipairs(names) do parts[i] = k .. "=\"" .. labels[k] .. "\"" end
    return name .. "{" .. table.concat(parts, ",") .. "}"
end

-- Returns the series table, the number of sample lines, and the first line it could not read (nil when all were).
local function parse_metrics(text)
    local series, n, bad = {}, 0, nil
    for line in text:gmatch("[^\n]+") do
        if line:sub(1, 1) ~= "#" then
            local name, rest = line:match("^([%a_:][%w_:]*)(.*)$")
            local labels, value = {}, nil
            if rest and rest:sub(1, 1) == "{" then
                local body, after = rest:match("^{(.-)}%s+(%S+)$")
                value = after
                for k, v in (body or ""):gmatch('([%a_][%w_]*)="(.-)",?') do labels[k] = v end
            elseif rest then
                value = rest:match("^%s+(%S+)$")
            end
            local num = value == "+Inf" and math.huge or tonumber(value)
            if name and num then
                series[key(name, labels)] = num
                n = n + 1
            else
                bad = bad or line
            end
        end
    end
    return series, n, bad
end

local function scrape(gw)
    local r, err = H.request(gw.port2, { path = "/metrics", headers = { { "Connection", "close" } } })
    assert(r, ctx(gw, "GET /metrics: " .. tostring(err)))
    assert.equal(200, r.status, ctx(gw, r.body))
    assert.equal("text/plain; version=0.0.4; charset=utf-8", r.headers["content-type"])
    local s, _, bad = parse_metrics(r.body)
    assert.is_nil(bad, "unreadable /metrics line: " .. tostring(bad))
    return s, r.body
end

-- The families whose every series is checked exactly (counters, and the histograms' counts).
local EXACT = {
    "ricochet_requests_total", "ricochet_attempts_total", "ricochet_retries_total", "ricochet_retry_refused_total",
    "ricochet_idempotency_total", "ricochet_script_errors_total", "ricochet_script_stopped_total",
    "ricochet_tls_handshakes_total", "ricochet_budget_refused_total", "ricochet_budget_waits_total",
    "ricochet_request_duration_seconds_count", "ricochet_retry_wait_seconds_count",
    "ricochet_upstream_response_seconds_count",
}
local function exact_family(k)
    local name = k:match("^[^{]+")
    for _, f in ipairs(EXACT) do
        if name == f then return true end
    end
    return false
end

-- Compares after - before with want (missing = 0) over every series of the EXACT families; returns a list of
-- the differences (empty when exact).
local function delta_mismatches(before, after, want)
    local out, seen = {}, {}
    for k, v in pairs(after) do
        if exact_family(k) then
            seen[k] = true
            local d = v - (before[k] or 0)
            if d ~= (want[k] or 0) then out[#out + 1] = ("%s: +%s, want +%s"):format(k, d, want[k] or 0) end
        end
    end
    for k, v in pairs(want) do
        if not seen[k] and v ~= 0 then out[#out + 1] = ("%s: missing, want +%s"):format(k, v) end
    end
    table.sort(out)
    return out
end

-- Scrapes until the counts are what want says (the last request's counts land as it is cleaned up, a moment
-- after its answer), bounded; returns the last scrape and the differences left.
local function settle(gw, before, want)
    local after, diff, text
    H.wait_until(function()
        after, text = scrape(gw)
        diff = delta_mismatches(before, after, want)
        return #diff == 0
    end, 15)
    return after, diff, text
end

-- Builds expectations: W.add(name, labels, n).
local function expectations()
    local want = {}
    local W = { want = want }
    function W.add(name, labels, n)
        local k = key(name, labels)
        want[k] = (want[k] or 0) + (n or 1)
    end
    -- a client request on route, answered code
    function W.request(route, code)
        W.add("ricochet_requests_total", { route = route, code = tostring(code) })
        W.add("ricochet_request_duration_seconds_count", { route = route })
    end
    -- an attempt; a response head (class ok 4xx 429 5xx) also times the upstream's response
    function W.attempt(route, upstream, class)
        W.add("ricochet_attempts_total", { route = route, upstream = upstream, class = class })
        if class == "ok" or class == "4xx" or class == "429" or class == "5xx" then
            W.add("ricochet_upstream_response_seconds_count", { upstream = upstream })
        end
    end
    -- a retry after an attempt that met reason, and the wait before it
    function W.retry(route, reason)
        W.add("ricochet_retries_total", { route = route, reason = reason })
        W.add("ricochet_retry_wait_seconds_count", { route = route })
    end
    function W.refused(route, why)
        W.add("ricochet_retry_refused_total", { route = route, why = why })
    end
    return W
end

---------------------------------------------------------------------------
-- Clients
---------------------------------------------------------------------------

local fire, entries = H.fire, H.entries

local function pids_of(list)
    local per, n = {}, 0
    for _, e in ipairs(list) do
        local pid = tostring(e.pid)
        if not per[pid] then n = n + 1 end
        per[pid] = (per[pid] or 0) + 1
    end
    return per, n
end

local function wait_logged(gw, prefix, n)
    return H.wait_until(function() return #entries(gw, prefix) >= n end, 15)
end

-- Unique path tags, so each spec's log lines and upstream programs are its own.
local tag_n = 0
local function tag(name)
    tag_n = tag_n + 1
    return ("%s%d"):format(name, tag_n)
end

---------------------------------------------------------------------------
-- Fixtures: a CA and a certificate for a.test, a route script, an LMDB store path; all under one temp dir
---------------------------------------------------------------------------

local function openssl(dir, args)
    local argv = { "openssl" }
    for _, a in ipairs(args) do argv[#argv + 1] = a end
    local code, out = H.run(argv, { timeout = 30 })
    assert(code == 0, "openssl " .. table.concat(args, " ") .. ": " .. tostring(out))
end

local function make_pki(dir)
    local ec = { "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes" }
    local function req(extra)
        local a = { "req" }
        for _, x in ipairs(ec) do a[#a + 1] = x end
        for _, x in ipairs(extra) do a[#a + 1] = x end
        openssl(dir, a)
    end
    req({ "-x509", "-keyout", dir .. "/ca.key", "-out", dir .. "/ca.pem", "-days", "1", "-subj", "/CN=metrics test CA" })
    req({ "-keyout", dir .. "/a.test.key", "-out", dir .. "/a.test.csr", "-subj", "/CN=a.test" })
    H.write_file(dir .. "/a.test.cnf", "subjectAltName=DNS:a.test\n")
    openssl(dir, { "x509", "-req", "-in", dir .. "/a.test.csr", "-CA", dir .. "/ca.pem", "-CAkey", dir .. "/ca.key",
        "-CAcreateserial", "-out", dir .. "/a.test.pem", "-days", "1", "-extfile", dir .. "/a.test.cnf" })
end

local SCRIPT = [[
local route = {}
function route.on_request(req)
    if req.path:find("^/script/throw") then error("on purpose") end
end
return route
]]

local CONF = [[
worker_processes 2;
error_log logs/error.log info;
pid logs/ricochet.pid;
http {
    # far above what these hooks take, however busy the machine (the bound counts wall time);
    # script_bounds_spec tests the bound
    script_timeout 1s;
    access_log {{PREFIX}}/logs/access.log;
    admin_listen 127.0.0.1:{{PORT2}};
    retry_backoff 1ms 2ms;
    upstream flaky { server {{UPSTREAM}} max_fails=0; retry_budget off; }
    upstream tiny { server {{UPSTREAM}} max_fails=0; retry_budget 1% min=0/s; }
    upstream dead { server 127.0.0.1:{{DEAD}} max_fails=0; retry_budget off; }
    server {
        listen 127.0.0.1:{{PORT}};
        server_name api.test;
        retry_attempts 3;
        idempotency_store lmdb:{{STORE}};
        location / { proxy_pass http://flaky; }
        location /tiny/ { proxy_pass http://tiny; }
        location /dead/ { proxy_pass http://dead; }
        location /keyed/ { idempotency_key on; proxy_pass http://flaky; }
        location /script/ { script {{SCRIPT}}; proxy_pass http://flaky; }
    }
    server {
        listen 127.0.0.1:{{TLSPORT}} ssl;
        server_name a.test;
        ssl_certificate {{DIR}}/a.test.pem;
        ssl_certificate_key {{DIR}}/a.test.key;
        location / { proxy_pass http://flaky; }
    }
}
]]

local API, TINY, DEAD, KEYED, SCRIPTED = "api.test /", "api.test /tiny/", "api.test /dead/", "api.test /keyed/",
    "api.test /script/"
local TLS_ROUTE, TLS_NOLOC = "a.test /", "a.test (no location)"

-- promtool and the python parser, each on the text; both must be there (make test's dependencies install them).
local function check_with_promtool(text, dir)
    local code = H.run("command -v promtool")
    assert(code == 0, "promtool is not installed (Debian package prometheus): it is a dependency of make test")
    H.write_file(dir .. "/metrics.txt", text)
    local rc, out = H.run("promtool check metrics < " .. H.shell_quote(dir .. "/metrics.txt"))
    assert(rc == 0, "promtool check metrics failed (" .. tostring(rc) .. "):\n" .. tostring(out))
end

local PY = [[
import sys
try:
    from prometheus_client.parser import text_string_to_metric_families
except ImportError as e:
    print("MISSING prometheus_client: %s" % e)
    sys.exit(3)
n = 0
for family in text_string_to_metric_families(open(sys.argv[1]).read()):
    n += len(family.samples)
print("SAMPLES %d" % n)
]]

local function check_with_python(text, dir)
    local f = io.open("/usr/bin/python3", "rb")
    assert(f, "/usr/bin/python3 is missing (python3-prometheus-client is a dependency of make test)")
    f:close()
    H.write_file(dir .. "/metrics.txt", text)
    H.write_file(dir .. "/parse.py", PY)
    local rc, out = H.run({ "/usr/bin/python3", dir .. "/parse.py", dir .. "/metrics.txt" })
    assert(rc ~= 3, "python3-prometheus-client is not installed (a dependency of make test): " .. tostring(out))
    assert(rc == 0, "prometheus_client's parser refused /metrics:\n" .. tostring(out))
    return tonumber(out:match("SAMPLES (%d+)"))
end

describe("/metrics over two workers", function()
    local up, gw, dir, store, conf, vars

    setup(function()
        dir = H.mkdtemp("metrics")
        make_pki(dir)
        H.write_file(dir .. "/route.lua", SCRIPT)
        store = dir .. "/idem.mdb"
        up = H.start_upstream()
        vars = { DEAD = H.dead_port(), TLSPORT = H.free_port(), STORE = store, SCRIPT = dir .. "/route.lua", DIR = dir }
        conf = CONF
        gw = H.start_gateway({ conf = conf, upstream = up, vars = vars })
    end)

    teardown(function()
        if gw then gw:stop() end
        if up then up:stop() end
        H.rm_rf(dir)
    end)

    -- n fresh-connection GETs answered 200 under prefix, repeated (bounded) until pid `want_pid` (or both workers,
    -- when nil) served at least one; returns how many were sent.
    local function spread_ok(prefix, W, want_pid)
        up:program({ default = { status = 200, body = "ok\n" } })
        local sent = 0
        for round = 1, 8 do
            local reqs = {}
            for i = 1, 8 do reqs[i] = { path = prefix .. round .. "/" .. i } end
            local resps, err = fire(gw.port, reqs, 4)
            for i = 1, #reqs do
                assert.equal(200, resps[i] and resps[i].status, ctx(gw, err))
                W.request(API, 200)
                W.attempt(API, "flaky", "ok")
            end
            sent = sent + #reqs
            assert.truthy(wait_logged(gw, prefix, sent), ctx(gw, "access log incomplete"))
            local per, n = pids_of(entries(gw, prefix))
            if (want_pid and per[tostring(want_pid)]) or (not want_pid and n == 2) then return sent, per end
        end
        local per = pids_of(entries(gw, prefix))
        error("the requests never reached " .. (want_pid and ("worker " .. want_pid) or "both workers") .. ": "
            .. json.encode(per))
    end

    it("counts a known mix of requests over both workers exactly, in text promtool and prometheus_client accept", function()
        local before = scrape(gw)
        local W = expectations()
        local t = "/" .. tag("mix")
        -- plain successes, until both workers served some
        spread_ok(t .. "/ok/", W)

        -- retried and refused outcomes, each path with its own program so the order of arrival does not matter
        local routes, reqs, expect_status = {}, {}, {}
        local function add(req, status, program)
            reqs[#reqs + 1] = req
            expect_status[#reqs] = status
            if program then routes[req.path] = program end
        end
        for i = 1, 4 do -- 503 then 200: one 5xx retry
            add({ path = t .. "/r/" .. i }, 200, { sequence = { 503 }, default = 200 })
            W.request(API, 200); W.attempt(API, "flaky", "5xx"); W.attempt(API, "flaky", "ok"); W.retry(API, "5xx")
        end
        for i = 1, 2 do -- 429 then 200
            add({ path = t .. "/q/" .. i }, 200, { sequence = { 429 }, default = 200 })
            W.request(API, 200); W.attempt(API, "flaky", "429"); W.attempt(API, "flaky", "ok"); W.retry(API, "429")
        end
        for i = 1, 2 do -- a reset before the head, then 200
            add({ path = t .. "/x/" .. i }, 200, { sequence = { { reset = "before_head" } }, default = 200 })
            W.request(API, 200); W.attempt(API, "flaky", "reset"); W.attempt(API, "flaky", "ok"); W.retry(API, "reset")
        end
        for i = 1, 3 do -- 503 three times: attempts exhausted
            add({ path = t .. "/all/" .. i }, 503, { default = 503 })
            W.request(API, 503)
            for _ = 1, 3 do W.attempt(API, "flaky", "5xx") end
            W.retry(API, "5xx"); W.retry(API, "5xx"); W.refused(API, "attempts_exhausted")
        end
        for i = 1, 3 do -- a budget that pays for nothing (1% of a handful of requests, no floor)
            add({ path = "/tiny" .. t .. "/" .. i }, 503, { default = 503 })
            W.request(TINY, 503); W.attempt(TINY, "tiny", "5xx"); W.refused(TINY, "budget")
            W.add("ricochet_budget_refused_total", { upstream = "tiny" })
        end
        for i = 1, 2 do -- a POST without a key is not replay-safe
            add({ method = "POST", path = t .. "/post/" .. i, body = "{}" }, 503, { default = 503 })
            W.request(API, 503); W.attempt(API, "flaky", "5xx"); W.refused(API, "unsafe")
        end
        for i = 1, 2 do -- nobody listens: three connect errors, the gateway's own 502
            add({ path = "/dead" .. t .. "/" .. i }, 502)
            W.request(DEAD, 502)
            for _ = 1, 3 do W.attempt(DEAD, "dead", "connect_error") end
            W.retry(DEAD, "connect_error"); W.retry(DEAD, "connect_error"); W.refused(DEAD, "attempts_exhausted")
        end
        for i = 1, 2 do -- on_request fails: logged and counted, the built-in policy goes on
            add({ path = "/script/throw" .. t .. "/" .. i }, 200, { default = 200 })
            W.request(SCRIPTED, 200); W.attempt(SCRIPTED, "flaky", "ok")
            W.add("ricochet_script_errors_total", { script = dir .. "/route.lua", hook = "on_request" })
        end
        add({ path = "/script/fine" .. t }, 200, { default = 200 })
        W.request(SCRIPTED, 200); W.attempt(SCRIPTED, "flaky", "ok")
        up:program({ default = 503, routes = routes })
        local resps, err = fire(gw.port, reqs, 4)
        for i, r in ipairs(reqs) do
            assert.equal(expect_status[i], resps[i] and resps[i].status, ctx(gw, r.path .. " " .. tostring(err)))
        end

        -- an idempotency key: executed and stored once, then replayed
        local keyed = "/keyed" .. t .. "/pay"
        up:program({ routes = { [keyed] = { default = { status = 201, body = "made\n" } } } })
        local idem_key = "metrics-" .. t:sub(2) .. "-" .. os.time()
        local post = { method = "POST", path = keyed, body = '{"amount":1}',
            headers = { { "Idempotency-Key", idem_key }, { "Content-Type", "application/json" } } }
        local first = fire(gw.port, { post }, 1)[1]
        assert.equal(201, first and first.status, ctx(gw))
        local storeid = "lmdb:" .. store
        W.request(KEYED, 201); W.attempt(KEYED, "flaky", "ok")
        W.add("ricochet_idempotency_total", { store = storeid, result = "claimed" })
        W.add("ricochet_idempotency_total", { store = storeid, result = "stored" })
        -- the answer is stored as the request ends: wait for the count before the repeat, or it may find the key
        -- still in flight (a 409 the client would be told to retry)
        local stored_key = key("ricochet_idempotency_total", { store = storeid, result = "stored" })
        assert.truthy(H.wait_until(function() return (scrape(gw)[stored_key] or 0) - (before[stored_key] or 0) >= 1 end, 3),
            ctx(gw, "the idempotency store never counted the answer as stored"))
        local again = fire(gw.port, { post }, 1)[1]
        assert.equal(201, again and again.status, ctx(gw))
        assert.equal("true", again.headers["idempotent-replayed"])
        assert.equal("made\n", again.body)
        W.request(KEYED, 201)
        W.add("ricochet_idempotency_total", { store = storeid, result = "replayed" })

        -- TLS: a real handshake and request; plain HTTP and garbage to the TLS port fail their handshakes
        local tlsport = vars.TLSPORT
        up:program({ default = { status = 200, body = "over tls\n" } })
        local code, out = H.run({ "curl", "-sS", "--max-time", "10", "--cacert", dir .. "/ca.pem", "--resolve",
            "a.test:" .. tlsport .. ":127.0.0.1", "https://a.test:" .. tlsport .. t .. "/tls" })
        assert.equal(0, code, out)
        assert.equal("over tls\n", out)
        W.request(TLS_ROUTE, 200); W.attempt(TLS_ROUTE, "flaky", "ok")
        W.add("ricochet_tls_handshakes_total", { server = "a.test", result = "ok" })
        local plain = H.raw(tlsport, "GET " .. t .. "/plain HTTP/1.1\r\nHost: a.test\r\nConnection: close\r\n\r\n",
            { timeout = 15 })
        assert.truthy(plain and plain:find("^HTTP/1%.1 400"), "plain HTTP to the TLS port: " .. tostring(plain))
        W.request(TLS_NOLOC, 400) -- a head refused before routing
        W.add("ricochet_tls_handshakes_total", { server = "a.test", result = "failed" })
        H.raw(tlsport, "\0\1\2\3 not a client hello \255\254\r\n\r\n", { timeout = 15 })
        W.add("ricochet_tls_handshakes_total", { server = "a.test", result = "failed" })

        -- every request of the mix is in the access log, and both workers served some of it
        local total = 0
        for k, v in pairs(W.want) do
            if k:find("^ricochet_requests_total") then total = total + v end
        end
        local function logged_mix()
            local n = 0
            for _, e in ipairs(H.access_entries(gw)) do
                if type(e.path) == "string" and e.path:find(t, 1, true) then n = n + 1 end
            end
            return n
        end
        -- the plain HTTP head is logged without a path (it never was a request): all the others carry the tag
        assert.truthy(H.wait_until(function() return logged_mix() >= total - 1 end, 15),
            ctx(gw, ("access log: %d of %d lines"):format(logged_mix(), total - 1)))
        local mix = {}
        for _, e in ipairs(H.access_entries(gw)) do
            if type(e.path) == "string" and e.path:find(t, 1, true) and not e.path:find("/ok/", 1, true) then
                mix[#mix + 1] = e
            end
        end
        local per, nworkers = pids_of(mix)
        assert.equal(2, nworkers, "the retried requests all went to one worker: " .. json.encode(per))

        local after, diff, text = settle(gw, before, W.want)
        assert.same({}, diff, ctx(gw, "counts off:\n" .. table.concat(diff, "\n")))
        -- each retry's wait is observed once, and histograms agree with themselves
        for k, v in pairs(after) do
            local name, labels = k:match("^(ricochet_[%w_]+)_count{(.*)}$")
            if name then
                local l = { le = "+Inf" }
                for lk, lv in labels:gmatch('([%a_][%w_]*)="(.-)",?') do l[lk] = lv end
                assert.equal(v, after[key(name .. "_bucket", l)], k .. " vs its +Inf bucket")
            end
        end
        assert.equal(1, after[key("ricochet_upstream_server_up", { upstream = "flaky", server = up.addr })])
        assert.equal(2, after["ricochet_workers"])
        assert.equal(1, after[key("ricochet_build_info", { version = "0.1.0" })])

        -- the same text through promtool and prometheus_client
        check_with_promtool(text, dir)
        local samples = check_with_python(text, dir)
        local _, nlines = parse_metrics(text)
        assert.equal(nlines, samples, "prometheus_client read another number of samples than there are lines")
    end)

    it("keeps every count when a worker is SIGKILLed and replaced, and counts on in the new one", function()
        local before = scrape(gw)
        local old = gw:workers()
        assert.equal(2, #old, ctx(gw))
        assert.truthy(H.pid_alive(old[1]))
        os.execute("kill -9 " .. old[1])
        local renewed = H.wait_until(function()
            local now = gw:workers()
            if #now == 2 and now[1] ~= old[1] and now[2] ~= old[1] then return now end
        end, 20)
        assert.truthy(renewed, ctx(gw, "no worker replaced the killed one"))
        local newpid = renewed[1] == old[2] and renewed[2] or renewed[1]
        -- nothing lost, nothing added
        local now = scrape(gw)
        local diff = delta_mismatches(before, now, {})
        assert.same({}, diff, ctx(gw, "the counts moved when a worker died:\n" .. table.concat(diff, "\n")))
        assert.truthy(H.wait_until(function() return scrape(gw)["ricochet_workers"] == 2 end, 15))
        -- and they go on counting, in the new worker too
        local W = expectations()
        spread_ok("/" .. tag("killed") .. "/", W, newpid)
        local _, diff2 = settle(gw, before, W.want)
        assert.same({}, diff2, ctx(gw, "counts off after the respawn:\n" .. table.concat(diff2, "\n")))
    end)

    it("carries every count over a reload of the same routes, and the generation goes up by one", function()
        local before = scrape(gw)
        -- only this spec reloads: the gateway is still on its first configuration
        local gen = before["ricochet_config_generation"]
        assert.equal(1, gen, "ricochet_config_generation before any reload")
        local old = gw:workers()
        local code, out = gw:reload(conf, vars)
        assert.equal(0, code, ctx(gw, out))
        assert.truthy(H.wait_until(function() return scrape(gw)["ricochet_config_generation"] == gen + 1 end, 20),
            ctx(gw, "the generation did not go from " .. gen .. " to " .. (gen + 1)))
        -- the old workers leave; the counts they made stay
        assert.truthy(H.wait_until(function()
            local now = gw:workers()
            for _, p in ipairs(now) do
                for _, o in ipairs(old) do if p == o then return false end end
            end
            return #now == 2
        end, 30), ctx(gw, "the old workers did not leave"))
        local now = scrape(gw)
        local diff = delta_mismatches(before, now, {})
        assert.same({}, diff, ctx(gw, "the counts moved over the reload:\n" .. table.concat(diff, "\n")))
        local W = expectations()
        spread_ok("/" .. tag("reloaded") .. "/", W)
        local after, diff2 = settle(gw, before, W.want)
        assert.same({}, diff2, ctx(gw, "counts off after the reload:\n" .. table.concat(diff2, "\n")))
        assert.equal(gen + 1, after["ricochet_config_generation"])
    end)

    it("writes each attempt of a retried request in its access log line, with the verdict and its reason", function()
        local t = "/" .. tag("log")
        local r_path, all_path, dead_path, tiny_path, post_path =
            t .. "/retried", t .. "/failing", "/dead" .. t, "/tiny" .. t, t .. "/post"
        up:program({ default = 503, routes = { [r_path] = { sequence = { 503 }, default = 200 } } })
        local resps = fire(gw.port, { { path = r_path }, { path = all_path }, { path = dead_path },
            { path = tiny_path }, { method = "POST", path = post_path, body = "x" } }, 1)
        local statuses = {}
        for i = 1, 5 do statuses[i] = resps[i] and resps[i].status or 0 end
        assert.same({ 200, 503, 502, 503, 503 }, statuses, ctx(gw))
        local function entry(path)
            assert.truthy(wait_logged(gw, path, 1), ctx(gw, "no access log line for " .. path))
            return entries(gw, path)[1]
        end
        local function shape(e, n)
            assert.equal(n, #e.attempts, json.encode(e))
            for _, a in ipairs(e.attempts) do
                assert.equal("number", type(a.wait), json.encode(a))
                assert.equal("number", type(a.duration), json.encode(a))
                assert.truthy(a.wait >= 0, json.encode(a))
            end
            assert.equal(0, e.attempts[1].wait, json.encode(e))
        end
        -- 503 then 200: two attempts, the 200 passed on as final
        local e = entry(r_path)
        shape(e, 2)
        assert.same({ up.addr, "status", 503 }, { e.attempts[1].server, e.attempts[1].class, e.attempts[1].status })
        assert.same({ up.addr, "status", 200 }, { e.attempts[2].server, e.attempts[2].class, e.attempts[2].status })
        assert.equal(200, e.status)
        assert.equal("passed", e.verdict, json.encode(e))
        assert.equal("final_status", e.reason, json.encode(e))
        assert.is_nil(e.not_retried, json.encode(e))
        -- 503 three times: the last 503 passed on, attempts exhausted
        e = entry(all_path)
        shape(e, 3)
        for _, a in ipairs(e.attempts) do assert.same({ up.addr, "status", 503 }, { a.server, a.class, a.status }) end
        assert.equal("passed", e.verdict, json.encode(e))
        assert.equal("attempts_exhausted", e.reason, json.encode(e))
        assert.equal("attempts_exhausted", e.not_retried, json.encode(e))
        -- three connect errors: no response to pass on, the gateway gave up with its own 502
        e = entry(dead_path)
        shape(e, 3)
        for _, a in ipairs(e.attempts) do
            assert.equal("connect_error", a.class, json.encode(a))
            assert.equal(json.null, a.status, json.encode(a))
            assert.equal("127.0.0.1:" .. vars.DEAD, a.server)
        end
        assert.equal(502, e.status)
        assert.equal("gave_up", e.verdict, json.encode(e))
        assert.equal("attempts_exhausted", e.reason, json.encode(e))
        -- the budget refused the retry; the POST without a key was not replay-safe
        e = entry(tiny_path)
        shape(e, 1)
        assert.equal("passed", e.verdict, json.encode(e))
        assert.equal("budget", e.reason, json.encode(e))
        e = entry(post_path)
        shape(e, 1)
        assert.equal("passed", e.verdict, json.encode(e))
        assert.equal("unsafe_method", e.reason, json.encode(e))
    end)
end)

---------------------------------------------------------------------------
-- access_log FILE buffer= flush=
---------------------------------------------------------------------------

local BUFFERED = [[
worker_processes 2;
error_log logs/error.log info;
http {
    access_log {{PREFIX}}/logs/access.log buffer=64k flush=1s;
    upstream up { server {{UPSTREAM}} max_fails=0; }
    server {
        listen 127.0.0.1:{{PORT}};
        location / { proxy_pass http://up; }
    }
}
]]

describe("access_log buffer= flush=", function()
    local up, gw

    before_each(function()
        up = H.start_upstream()
        gw = H.start_gateway({ conf = BUFFERED, upstream = up })
    end)

    after_each(function()
        if gw then gw:stop() end
        if up then up:stop() end
    end)

    local function lines(prefix)
        local n = 0
        for line in (H.read_file(gw.prefix .. "/logs/access.log") or ""):gmatch("([^\n]*)\n") do
            local ok, e = pcall(json.decode, line)
            assert.truthy(ok, "a broken line in the access log: " .. line)
            if e.path:sub(1, #prefix) == prefix then n = n + 1 end
        end
        return n
    end

    local function send(prefix, n)
        local reqs = {}
        for i = 1, n do reqs[i] = { path = prefix .. i } end
        local resps, err = fire(gw.port, reqs, 4)
        for i = 1, n do assert.equal(200, resps[i] and resps[i].status, ctx(gw, err)) end
    end

    it("holds the lines for a while, then writes them all within the flush time", function()
        local t0 = socket.gettime()
        send("/held/", 6)
        -- no line can be a second old yet, and 6 short lines do not fill 64k
        local n = lines("/held/")
        if socket.gettime() - t0 < 0.8 then
            assert.equal(0, n, "the lines were written one by one")
        end
        assert.truthy(H.wait_until(function() return lines("/held/") == 6 end, 15),
            ctx(gw, "the buffered lines did not appear: " .. lines("/held/") .. " of 6"))
    end)

    it("loses no line at a graceful stop (SIGQUIT), from either worker", function()
        local t0 = socket.gettime()
        send("/quit/", 40)
        local early = lines("/quit/")
        if socket.gettime() - t0 < 0.8 then
            assert.equal(0, early, "the lines were written one by one")
        end
        assert.truthy(gw:signal("QUIT"))
        assert.truthy(gw:wait_exit(30), ctx(gw, "the gateway did not stop on SIGQUIT"))
        assert.equal(40, lines("/quit/"), ctx(gw, "lines lost at the graceful stop"))
        local per, n, ids = {}, 0, {}
        for line in H.read_file(gw.prefix .. "/logs/access.log"):gmatch("([^\n]*)\n") do
            local e = json.decode(line)
            assert.is_nil(ids[e.id], "a line written twice: " .. line)
            ids[e.id] = true
            if not per[e.pid] then n = n + 1 end
            per[e.pid] = true
        end
        -- which worker accepts is the kernel's choice (both nearly always do over 40 fresh connections); either
        -- way every line a worker held when told to quit is in the file
        assert.truthy(n >= 1)
    end)

    it("is refused by ricochet -t with FILE:LINE for a buffer below 1k and for off with a buffer", function()
        local dir = H.mkdtemp("alog")
        local function refused(line, pattern)
            local conf = "http {\n    server {\n        listen 127.0.0.1:1;\n        " .. line
                .. "\n        location / { proxy_pass http://127.0.0.1:2; }\n    }\n}\n"
            H.write_file(dir .. "/bad.conf", conf)
            local code, out = H.run({ H.bin(), "-t", "-p", dir, "-c", dir .. "/bad.conf" })
            assert.is_not.equal(0, code, out)
            assert.truthy(out:find(pattern), out)
        end
        refused("access_log " .. dir .. "/a.log buffer=1;", 'bad%.conf:4: invalid "buffer=1" in "access_log"')
        refused("access_log off buffer=4k;", 'bad%.conf:4: "access_log off" takes no buffer=')
        H.rm_rf(dir)
    end)

    it("refuses to start on a FIFO nobody reads, instead of hanging in its open", function()
        local dir = H.mkdtemp("alog")
        assert.equal(0, (H.run({ "mkfifo", dir .. "/a.fifo" })))
        H.write_file(dir .. "/r.conf", "error_log stderr;\nhttp {\n    access_log " .. dir .. "/a.fifo;\n"
            .. "    server { listen 127.0.0.1:" .. H.free_port() .. "; }\n}\n")
        local code, out = H.run({ H.bin(), "-p", dir, "-c", dir .. "/r.conf" }, { timeout = 10 })
        assert.equal(1, code, out)
        assert.truthy(out:find("a FIFO needs its reader first", 1, true), out)
        H.rm_rf(dir)
    end)
end)

---------------------------------------------------------------------------
-- access_log on a pipe (a FIFO a log shipper reads): whole lines only, from both workers
---------------------------------------------------------------------------

local PIPED = [[
worker_processes 2;
error_log logs/error.log info;
http {
    access_log {{FIFO}} buffer=64k flush=10s;
    upstream up { server {{UPSTREAM}} max_fails=0; }
    server {
        listen 127.0.0.1:{{PORT}};
        location / { proxy_pass http://up; }
    }
}
]]

-- The reader: opens the FIFO at once (without waiting for a writer, then says so in READY: the gateway refuses a
-- FIFO nobody reads), shrinks the pipe to one page and reads a page a millisecond, as a busy log shipper might
-- (so the workers' writes wait on it, and a write longer than a page goes in many pieces), copying everything to
-- OUT until the last writer closes.
local FIFO_READER = [[
import errno, os, sys, fcntl, time
fd = os.open(sys.argv[1], os.O_RDONLY | os.O_NONBLOCK)
try:
    fcntl.fcntl(fd, 1031, 4096)  # F_SETPIPE_SZ
except OSError as e:
    sys.stderr.write("F_SETPIPE_SZ: %s\n" % e)
open(sys.argv[3], "w").close()
seen = False
deadline = time.time() + 600  # ends with the last writer; a bound only against a lost gateway
with open(sys.argv[2], "wb") as out:
    while time.time() < deadline:
        try:
            b = os.read(fd, 4096)
        except OSError as e:
            if e.errno != errno.EAGAIN:
                raise
            time.sleep(0.001)
            continue
        if not b:
            if seen:
                break  # the last writer closed
            time.sleep(0.01)  # no writer yet
            continue
        seen = True
        out.write(b)
        time.sleep(0.001)
]]

describe("access_log buffer= on a FIFO", function()
    local up, gw, reader, dir

    after_each(function()
        if gw then gw:stop() end
        if reader then reader:stop() end
        if up then up:stop() end
        H.rm_rf(dir)
        gw, reader, up, dir = nil, nil, nil, nil
    end)

    it("writes only whole JSON lines, one per request, from two workers under load and at SIGQUIT", function()
        up = H.start_upstream()
        up:program({ default = { status = 200, body = "ok\n" } })
        dir = H.mkdtemp("fifo")
        local fifo, out = dir .. "/access.fifo", dir .. "/out.txt"
        assert.equal(0, (H.run({ "mkfifo", fifo })))
        H.write_file(dir .. "/reader.py", FIFO_READER)
        -- the reader first: the gateway refuses to start on a FIFO nobody reads
        reader = H.start_process({ "/usr/bin/python3", dir .. "/reader.py", fifo, out, dir .. "/ready" },
            dir .. "/reader.err")
        assert.truthy(H.wait_until(function() return H.read_file(dir .. "/ready") ~= nil end, 10),
            "the FIFO's reader did not start")
        gw = H.start_gateway({ conf = PIPED, upstream = up, vars = { FIFO = fifo } })
        local pad = ("/" .. ("p"):rep(99)):rep(15) -- 1500 bytes of path
        local N, width, ok_n = 2000, 8, 0
        local want = {}
        for start = 1, N, width do
            local reqs = {}
            for i = start, math.min(start + width - 1, N) do
                local path = "/fifo/" .. i .. pad
                reqs[#reqs + 1] = { path = path }
                want[path] = true
            end
            local resps, err = fire(gw.port, reqs, width)
            for i = 1, #reqs do
                assert.equal(200, resps[i] and resps[i].status, ctx(gw, err))
                ok_n = ok_n + 1
            end
        end
        assert.equal(N, ok_n)
        assert.is_true(gw:signal("QUIT"))
        assert.truthy(gw:wait_exit(60), ctx(gw, "the gateway did not stop on SIGQUIT"))
        assert.truthy(reader:wait_exit(30), "the reader saw no end of the FIFO after the gateway left")
        assert.equal("", H.read_file(dir .. "/reader.err") or "")
        local n, seen = 0, {}
        local lineno = 0
        for line in (H.read_file(out) or ""):gmatch("([^\n]*)\n") do
            lineno = lineno + 1
            local ok, e = pcall(json.decode, line)
            assert.truthy(ok and type(e) == "table",
                ("line %d of the FIFO's output is not JSON: %s"):format(lineno, line:sub(1, 200) .. "..." .. line:sub(-200)))
            assert.truthy(want[e.path], "a line for a request never sent: " .. tostring(e.path):sub(1, 80))
            assert.is_nil(seen[e.path], "a request logged twice: " .. e.path:sub(1, 80))
            seen[e.path] = true
            n = n + 1
        end
        assert.equal(N, n, "lines in the FIFO's output")
        assert.equal("\n", (H.read_file(out) or ""):sub(-1), "the output does not end with a whole line")
    end)
end)

---------------------------------------------------------------------------
-- labels of any length, and names that are UTF-8
---------------------------------------------------------------------------

local LABELS = [[
worker_processes 2;
error_log logs/error.log info;
http {
    admin_listen 127.0.0.1:{{PORT2}};
    upstream u { server {{UPSTREAM}} max_fails=0; }
    server {
        listen 127.0.0.1:{{PORT}};
        server_name {{NAME}};
        location {{LONG}} { proxy_pass http://u; }
        location {{SHARED}}/a { proxy_pass http://u; }
        location {{SHARED}}/b { proxy_pass http://u; }
    }
    server {
        listen 127.0.0.1:{{PORT3}};
        location /café { proxy_pass http://u; }
    }
}
]]

describe("/metrics labels", function()
    local up, gw, dir
    local NAME = ("long-name-"):rep(20)                           -- 200 bytes, no quote
    local LONG = ("/" .. ("abcdefghi"):rep(11)):rep(30)           -- 3000 bytes
    local SHARED = ("/" .. ("s"):rep(99)):rep(15)                 -- 1500 bytes both share

    setup(function()
        dir = H.mkdtemp("labels")
        up = H.start_upstream()
        up:program({ default = { status = 200, body = "ok\n" } })
        gw = H.start_gateway({ conf = LABELS, upstream = up,
            vars = { NAME = NAME, LONG = LONG, SHARED = SHARED, PORT3 = H.free_port() } })
    end)

    teardown(function()
        if gw then gw:stop() end
        if up then up:stop() end
        H.rm_rf(dir)
    end)

    it("prints a 3000-byte route and a 200-byte server name whole, in text promtool accepts, one series per route", function()
        assert.equal(3000, #LONG)
        assert.equal(200, #NAME)
        local before = scrape(gw)
        local sent = { { LONG .. "/x", 1 }, { SHARED .. "/a/x", 1 }, { SHARED .. "/b/x", 2 } }
        local W = expectations()
        for _, s in ipairs(sent) do
            local route = NAME .. " " .. s[1]:gsub("/x$", "")
            for _ = 1, s[2] do
                local r, err = H.request(gw.port, { path = s[1], headers = { { "Host", NAME } } })
                assert.truthy(r, ctx(gw, err))
                assert.equal(200, r.status, ctx(gw, s[1]:sub(1, 40)))
                W.request(route, 200)
                W.attempt(route, "u", "ok")
            end
        end
        local after, diff, text = settle(gw, before, W.want)
        assert.same({}, diff)
        -- the full labels, each its own series
        local function count(route) return after[key("ricochet_requests_total", { route = route, code = "200" })] end
        assert.equal(1, count(NAME .. " " .. LONG))
        assert.equal(1, count(NAME .. " " .. SHARED .. "/a"))
        assert.equal(2, count(NAME .. " " .. SHARED .. "/b"))
        assert.truthy(after[key("ricochet_request_duration_seconds_count", { route = NAME .. " (no location)" })],
            "no series for the server's own route, labelled with its 200-byte name")
        check_with_promtool(text, dir)
        check_with_python(text, dir)
    end)

    it("shows a UTF-8 location (/café) as UTF-8 in /status.json, the same text as its Prometheus label", function()
        local port3 = tonumber(gw.vars.PORT3)
        local route = "127.0.0.1:" .. port3 .. " /caf\195\169"
        local doc = H.wait_until(function()
            local r = H.request(gw.port2, { path = "/status.json" })
            return r and r.status == 200 and r
        end, 15)
        assert.truthy(doc, ctx(gw, "/status.json never answered 200"))
        assert.truthy(doc.body:find('"route":"' .. route .. '"', 1, true),
            "the route is not UTF-8 as written in /status.json: " .. (doc.body:match('"route":"127%.0%.0%.1:' .. port3 .. '[^"]*"') or "none"))
        local found
        for _, r in ipairs(json.decode(doc.body).routes) do
            if r.route == route then found = r end
        end
        assert.truthy(found, doc.body)
        local _, text = scrape(gw)
        assert.truthy(text:find('ricochet_request_duration_seconds_count{route="' .. found.route .. '"} ', 1, true),
            "no Prometheus series with the same route label as /status.json: " .. found.route)
    end)
end)
