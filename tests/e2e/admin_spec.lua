-- The admin listener end to end (admin_listen, admin_allow): its strict HTTP/1.1, /healthz, /readyz across a
-- reload and a graceful quit, /status.json's samples and their counts, and the status page as a real headless
-- Chromium draws it, figure by figure against /status.json?seq=N.
package.path = "tests/e2e/?.lua;" .. package.path
local H = require("helpers")
local socket = require("socket")

local json = H.json
local now = socket.gettime

local CHROMIUM = os.getenv("CHROMIUM") or "/usr/bin/chromium"

local ctx = H.context

-- One request to the gateway's admin listener (PORT2 in every config here).
local function admin(gw, path, req)
    req = req or {}
    req.path = path
    req.timeout = req.timeout or 5
    return H.request(gw.port2, req)
end

local function admin_json(gw, path)
    local r, err = admin(gw, path)
    assert(r, ctx(gw, "admin " .. path .. ": " .. tostring(err)))
    local ok, doc = pcall(json.decode, r.body)
    return r, ok and doc or nil
end

-- The latest sample, once there is one (bounded wait).
local function sample(gw, seconds)
    local doc = H.wait_until(function()
        local r, d = admin_json(gw, "/status.json")
        return r.status == 200 and d or nil
    end, seconds or 15)
    assert(doc, ctx(gw, "/status.json never answered 200"))
    return doc
end

-- The first sample taken strictly after sample `seq`.
local function sample_after(gw, seq, seconds)
    local doc = H.wait_until(function()
        local d = sample(gw)
        return d.seq > seq and d or nil
    end, seconds or 15)
    assert(doc, ctx(gw, "no sample after " .. seq .. " within the wait"))
    return doc
end

local function by(list, field, value)
    for _, x in ipairs(list or {}) do
        if x[field] == value then return x end
    end
    return nil
end

-- Whether the port takes a connection now (the admin listener opens with the workers).
local function accepts(port)
    local c = H.connect(port, { timeout = 0.2 })
    if c then c:close() end
    return c ~= nil
end

-- Bytes of a Lua pattern taken literally.
local function lit(s) return (s:gsub("%p", "%%%0")) end

-- Sum of every ricochet_requests_total sample in a /metrics text.
local function requests_total(text)
    local n = 0
    for v in text:gmatch("\nricochet_requests_total{[^}]*} (%d+)") do n = n + tonumber(v) end
    return n
end

---------------------------------------------------------------------------
-- the status page against /status.json: what each data-k figure must show
---------------------------------------------------------------------------

local DECIMALS = { requests_per_sec = 2, retries_per_sec = 2, success_rate = 2, p99_ms = 1, p50_ms = 1,
    budget_tokens = 1 }
local COMMON = { "requests_per_sec", "retries_per_sec", "success_rate", "p99_ms", "p50_ms", "requests", "retries" }
local UPSTREAM_ONLY = { "budget_tokens", "budget_waits", "budget_refused" }
local ROUTE_ONLY = { "refused", "script_errors" }

-- Every figure the page should show for a sample: data-k -> {value, decimals} or {text}; and their count.
local function status_figures(doc)
    local out, n = {}, 0
    local function put(k, w) out[k] = w; n = n + 1 end
    local function nums(prefix, x, fields)
        for _, f in ipairs(fields) do put(prefix .. f, { value = x[f], decimals = DECIMALS[f] or 0 }) end
    end
    for _, u in ipairs(doc.upstreams) do
        local p = "upstream:" .. u.name .. ":"
        nums(p, u, COMMON)
        nums(p, u, UPSTREAM_ONLY)
        for _, s in ipairs(u.servers) do put(p .. "server:" .. s.server, { text = s.server .. (s.up and " up" or " down") }) end
    end
    for _, r in ipairs(doc.routes) do
        local p = "route:" .. r.route .. ":"
        nums(p, r, COMMON)
        nums(p, r, ROUTE_ONLY)
        for k, v in pairs(r.idempotency) do
            if v ~= 0 then put(p .. "idempotency:" .. k, { value = v, decimals = 0 }) end
        end
    end
    return out, n
end

local function unhtml(s)
    return (s:gsub("&quot;", '"'):gsub("&lt;", "<"):gsub("&gt;", ">"):gsub("&#39;", "'"):gsub("&nbsp;", "\194\160")
        :gsub("&amp;", "&"))
end

-- Every data-k element of a dumped DOM: key -> its text; and their count (a key shown twice is an error).
local function page_figures(dom)
    local out, n = {}, 0
    for attrs, text in dom:gmatch("<%a+%s([^>]*)>([^<]*)") do
        local k = attrs:match('data%-k="([^"]*)"')
        if k then
            k = unhtml(k)
            assert(out[k] == nil, "the page shows " .. k .. " twice")
            out[k] = unhtml(text)
            n = n + 1
        end
    end
    return out, n
end

-- The shown text against the JSON: "—" for null, else the same number with the JSON's decimals.
local function figure_matches(text, w)
    if w.text then return text == w.text end
    if w.value == nil or w.value == json.null then return text == "\226\128\148" end
    local pat = w.decimals == 0 and "^%-?%d+$" or ("^%-?%d+%." .. ("%d"):rep(w.decimals) .. "$")
    if not text:find(pat) then return false end
    return math.abs(tonumber(text) - w.value) <= 1e-9 * math.max(1, math.abs(w.value))
end

---------------------------------------------------------------------------
-- the gateway most tests share: one adaptive-budget upstream, one without a budget, three routes
---------------------------------------------------------------------------

local MAIN = [[
worker_processes 2;
error_log logs/error.log info;
pid logs/ricochet.pid;
http {
    access_log logs/access.log;
    admin_listen 127.0.0.1:{{PORT2}};
    upstream web { server {{UPSTREAM}}; }
    upstream count { server {{UPSTREAM}}; retry_budget off; }
    upstream doomed { server {{UPSTREAM}}; retry_budget off; }
    server {
        listen 127.0.0.1:{{PORT}};
        retry_attempts 3;
        retry_backoff 10ms 20ms;
        location / { proxy_pass http://web; }
        location /count/ { proxy_pass http://count; }
        location /doomed/ { proxy_pass http://doomed; }
        location /pay/ {
            idempotency_key on;
            idempotency_store lmdb:{{PREFIX}}/idem.mdb;
            proxy_pass http://web;
        }
    }
}
]]

describe("the admin listener", function()
    local up, gw

    setup(function()
        up = H.start_upstream()
        up:program({ default = { status = 200, body = "ok\n" } })
        gw = H.start_gateway({ conf = MAIN, upstream = up })
        -- the admin listener opens with the workers; wait for it rather than assume it
        assert(H.wait_until(function() return accepts(gw.port2) end, 15), ctx(gw))
    end)

    teardown(function()
        if gw then gw:stop() end
        if up then up:stop() end
    end)

    it("answers 404 for an unknown path, 405 with Allow for other methods, HEAD without a body, / with 302", function()
        for _, path in ipairs({ "/nope", "/metrics/", "/metricsx", "/status.json/1", "/favicon.ico" }) do
            local r = assert(admin(gw, path))
            assert.equal(404, r.status, path)
        end
        -- the path is checked before the method
        assert.equal(404, assert(admin(gw, "/nope", { method = "DELETE" })).status)

        for _, method in ipairs({ "POST", "PUT", "DELETE" }) do
            local r = assert(admin(gw, "/metrics", { method = method, body = method == "DELETE" and nil or "x=1" }))
            assert.equal(405, r.status, method)
            assert.equal("GET, HEAD", r.headers["allow"], method)
        end
        local r = assert(admin(gw, "/healthz", { method = "POST", body = "" }))
        assert.equal(405, r.status)
        assert.equal("GET, HEAD", r.headers["allow"])

        -- HEAD: the GET's headers, and not one byte after them
        local raw, closed = H.raw(gw.port2, "HEAD /metrics HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n")
        assert.is_true(closed)
        local head, rest = raw:match("^(.-\r\n)\r\n(.*)$")
        assert.truthy(head, raw)
        assert.matches("^HTTP/1%.1 200 ", head)
        assert.matches("\r\nContent%-Type: text/plain; version=0%.0%.4", head)
        assert.truthy(tonumber(head:match("\r\nContent%-Length: (%d+)")) > 0, head)
        assert.equal("", rest)

        r = assert(admin(gw, "/"))
        assert.equal(302, r.status)
        assert.equal("/status", r.headers["location"])
    end)

    it("answers a malformed request line with 400 and closes the connection", function()
        for _, line in ipairs({ "NOT A REQUEST LINE", "GET /healthz HTTP/1.1 extra", "GET  /healthz HTTP/1.1",
            "GET healthz HTTP/1.1", "GET /healthz HTTP/1.1x" }) do
            -- a good request right behind it must not be answered: the connection ends at the 400
            local data, closed, err = H.raw(gw.port2, line .. "\r\nHost: a\r\n\r\nGET /healthz HTTP/1.1\r\nHost: a\r\n\r\n",
                { timeout = 3 })
            assert.truthy(data, tostring(err))
            assert.matches("^HTTP/1%.1 400 ", data, line)
            assert.is_true(closed, line .. ": the connection stayed open after the 400")
            local list = H.parse_responses(data)
            assert.equal(1, #list, line .. ": " .. data)
        end
    end)

    it("keeps one connection alive across several requests, HEAD included", function()
        local conn = assert(H.connect(gw.port2))
        local seq = {
            { "GET", "/healthz", 200 }, { "HEAD", "/metrics", 200 }, { "GET", "/readyz", 200 },
            { "GET", "/metrics", 200 }, { "GET", "/nope", 404 }, { "GET", "/status", 200 },
            { "HEAD", "/status", 200 }, { "GET", "/", 302 }, { "GET", "/healthz", 200 },
        }
        for i, s in ipairs(seq) do
            local r, err = conn:request({ method = s[1], path = s[2] })
            assert.truthy(r, ("request %d (%s %s) on the kept connection: %s"):format(i, s[1], s[2], tostring(err)))
            assert.equal(s[3], r.status, s[1] .. " " .. s[2])
            assert.not_equal("close", (r.headers["connection"] or ""):lower(), s[1] .. " " .. s[2])
            if s[1] == "HEAD" then assert.equal("", r.body) end
        end
        assert.is_false(conn:closed(0.2), "the gateway closed a kept-alive admin connection")
        conn:close()
    end)

    it("leaves admin requests out of the access log and out of the metrics", function()
        assert.equal(200, assert(H.request(gw.port, { path = "/before-admin" })).status)
        H.wait_until(function() return #H.access_entries(gw, "/before-admin") == 1 end, 15)
        local before = requests_total("\n" .. assert(admin(gw, "/metrics")).body)
        for _, p in ipairs({ "/metrics", "/healthz", "/readyz", "/status", "/status.json", "/", "/nope", "/metrics?x" }) do
            assert(admin(gw, p))
        end
        assert(admin(gw, "/metrics", { method = "POST", body = "x" }))
        assert.matches("^HTTP/1%.1 400 ", (H.raw(gw.port2, "BAD REQUEST LINE\r\n\r\n")))
        local after = requests_total("\n" .. assert(admin(gw, "/metrics")).body)
        assert.equal(before, after, "admin requests were counted in ricochet_requests_total")

        assert.equal(200, assert(H.request(gw.port, { path = "/after-admin" })).status)
        assert.truthy(H.wait_until(function() return #H.access_entries(gw, "/after-admin") == 1 end, 15),
            ctx(gw, "the proxied request never reached the access log"))
        -- every other request to this gateway so far went to the admin listener (malformed ones too)
        local paths = {}
        for _, e in ipairs(H.access_entries(gw)) do paths[#paths + 1] = tostring(e.path) end
        assert.same({ "/before-admin", "/after-admin" }, paths)
    end)

    it("reports /healthz with the version, generation, workers, uptime and the master's pid", function()
        local _, version = H.run({ H.bin(), "-v" })
        version = version:match("ricochet version (%S+)")
        -- both workers register at start; wait for that instead of racing it
        local doc = H.wait_until(function()
            local r, d = admin_json(gw, "/healthz")
            return r.status == 200 and d and d.workers == 2 and d or nil
        end, 15)
        assert.truthy(doc, ctx(gw, "healthz never showed 2 workers"))
        local r = assert(admin(gw, "/healthz"))
        assert.equal(200, r.status)
        assert.matches("^application/json", r.headers["content-type"])
        assert.equal("ok", doc.status)
        assert.equal(version, doc.version)
        assert.equal(1, doc.generation)
        assert.equal(2, doc.workers)
        assert.is_number(doc.uptime_seconds)
        assert.truthy(doc.uptime_seconds > 0, r.body)
        assert.equal(gw.pid, doc.master_pid)

        local rr, ready = admin_json(gw, "/readyz")
        assert.equal(200, rr.status)
        assert.same({ ready = true }, ready)
    end)

    it("counts a route's and its upstream's requests, retries and attempts as they happened", function()
        up:program({ default = { status = 200, body = "ok\n" }, routes = {
            ["/count/once"] = { sequence = { { status = 503 } }, default = { status = 200 } },
            ["/count/never"] = { default = { status = 503 } },
            ["/count/missing"] = { default = { status = 404 } },
        } })
        -- 200 at once; 503 then 200; 503 three times (given up: attempts_exhausted); 404, not retried
        local want = { { "/count/ok", 200 }, { "/count/once", 200 }, { "/count/never", 503 }, { "/count/missing", 404 } }
        for _, w in ipairs(want) do
            local r = assert(H.request(gw.port, { path = w[1] }))
            assert.equal(w[2], r.status, w[1])
        end
        assert.truthy(H.wait_until(function()
            local n = 0
            for _, w in ipairs(want) do n = n + #H.access_entries(gw, w[1]) end
            return n == #want
        end, 3), ctx(gw, "the access log misses a /count/ request"))
        local doc = sample_after(gw, sample(gw).seq)

        local route = by(doc.routes, "route", "127.0.0.1:" .. gw.port .. " /count/")
        assert.truthy(route, json.encode(doc.routes))
        assert.equal("count", route.upstream)
        assert.equal(4, route.requests)
        assert.equal(3, route.retries)
        assert.equal(7, route.attempts)
        assert.equal(1, route.refused)
        assert.equal(75, route.success_rate) -- three of the four answers were below 500
        local u = by(doc.upstreams, "name", "count")
        assert.truthy(u, json.encode(doc.upstreams))
        assert.equal(4, u.requests)
        assert.equal(3, u.retries)
        assert.equal(7, u.attempts)
        assert.same({ { server = up.addr, up = true } }, u.servers)
        assert.equal(json.null, u.budget_tokens) -- retry_budget off
        -- the same figures in /metrics
        local m = assert(admin(gw, "/metrics")).body
        local label = 'route="127.0.0.1:' .. gw.port .. ' /count/"'
        assert.matches("ricochet_requests_total{" .. lit(label) .. ',code="200"} 2\n', m)
        assert.matches("ricochet_requests_total{" .. lit(label) .. ',code="503"} 1\n', m)
        assert.matches("ricochet_requests_total{" .. lit(label) .. ',code="404"} 1\n', m)
        assert.matches("ricochet_retry_refused_total{" .. lit(label) .. ',why="attempts_exhausted"} 1\n', m)
    end)

    it("gives an upstream whose every attempt failed a success rate of 0.00 %", function()
        up:program({ default = { status = 200, body = "ok\n" }, routes = { ["/doomed/x"] = { default = { status = 503 } } } })
        for _ = 1, 2 do
            assert.equal(503, assert(H.request(gw.port, { path = "/doomed/x" })).status)
        end
        H.wait_until(function() return #H.access_entries(gw, "/doomed/x") == 2 end, 15)
        local doc = sample_after(gw, sample(gw).seq)
        local route = by(doc.routes, "route", "127.0.0.1:" .. gw.port .. " /doomed/")
        local u = by(doc.upstreams, "name", "doomed")
        assert.equal(2, route.requests)
        assert.equal(6, route.attempts)
        assert.equal(0, route.success_rate)
        assert.equal(6, u.attempts)
        -- 6 attempts, 6 answered 503: whatever it is a share of, the upstream's success is 0 %
        assert.truthy(u.success_rate ~= json.null and u.success_rate >= 0 and u.success_rate <= 100,
            "upstream success_rate out of 0..100: " .. tostring(u.success_rate))
        assert.equal(0, u.success_rate)
    end)

    it("draws the status page in headless Chromium with exactly the figures of /status.json?seq=N", function()
        local f = io.open(CHROMIUM, "rb")
        if not f then
            error("the status page test needs Chromium at " .. CHROMIUM .. " (make test installs it; or set CHROMIUM=)")
        end
        f:close()
        up:program({ default = { status = 200, body = "ok\n" },
            routes = { ["/flaky"] = { sequence = { { status = 503 }, { status = 200 } }, cycle = true } } })
        local dir = H.mkdtemp("chrome")
        local load = dir .. "/load.lua"
        -- traffic while the page loads: plain GETs, 503s that are retried, and idempotency keys that replay
        H.write_file(load, ([[
local socket = require("socket")
local stop = socket.gettime() + %d
local i = 0
local function req(bytes)
    local s = socket.tcp(); s:settimeout(3)
    if s:connect("127.0.0.1", %d) then s:send(bytes); s:receive("*a") end
    s:close()
end
while socket.gettime() < stop and i < 100000 do
    i = i + 1
    req("GET /page/" .. i .. " HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n")
    req("GET /flaky HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n")
    req("POST /pay/ HTTP/1.1\r\nHost: a\r\nConnection: close\r\nIdempotency-Key: key-" .. (i %% 4)
        .. "\r\nContent-Length: 4\r\n\r\nsame")
    socket.sleep(0.02)
end
]]):format(300, gw.port)) -- until loader:stop(): the second page load must still see new requests, however long
                           -- a busy machine takes to run chromium twice
        local loader = H.start_process({ os.getenv("LUAJIT") or "luajit", load }, dir .. "/load.log")

        local function page()
            local cmd = {}
            for i, a in ipairs({ CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
                "--user-data-dir=" .. dir .. "/profile", "--virtual-time-budget=3000", "--dump-dom",
                ("http://127.0.0.1:%d/status"):format(gw.port2) }) do
                cmd[i] = H.shell_quote(a)
            end
            local code, dom = H.run(table.concat(cmd, " ") .. " 2>" .. H.shell_quote(dir .. "/chromium.err"),
                { timeout = 40 })
            assert.equal(0, code, "chromium failed:\n" .. (H.read_file(dir .. "/chromium.err") or ""):sub(-2000))
            return dom
        end

        local function check(dom)
            local seq
            for tag in dom:gmatch("<%a+%s[^>]*>") do
                if tag:find('id="seq"', 1, true) then seq = tonumber(tag:match('data%-seq="(%d+)"')) end
            end
            assert.truthy(seq, "the page never set data-seq:\n" .. dom:sub(1, 3000))
            local r = assert(admin(gw, "/status.json?seq=" .. seq))
            assert.equal(200, r.status, r.body)
            local doc = json.decode(r.body)
            assert.equal(seq, doc.seq)
            local want, nwant = status_figures(doc)
            local shown, nshown = page_figures(dom)
            for k, w in pairs(want) do
                assert.truthy(shown[k], ("sample %d: the page does not show %q"):format(seq, k))
                assert.truthy(figure_matches(shown[k], w),
                    ("sample %d: %q shows %q, the JSON has %s"):format(seq, k, shown[k],
                        w.text or tostring(w.value)))
            end
            for k, v in pairs(shown) do
                assert.truthy(want[k], ("sample %d: the page shows %q = %q, which /status.json does not have"):format(seq, k, v))
            end
            assert.equal(nwant, nshown)
            -- not vacuous: every upstream and route is there, and a null shows as a dash
            assert.equal(3, #doc.upstreams)
            assert.equal(4, #doc.routes)
            assert.equal("\226\128\148", shown["upstream:count:budget_tokens"])
            local function text_of(id) return dom:match('id="' .. id .. '"[^>]*>([^<]*)<') end
            assert.equal(doc.version, text_of("version"))
            assert.equal(tostring(doc.generation), text_of("generation"))
            return doc, seq
        end

        local ok, err = pcall(function()
            -- traffic of every kind has been sampled before the first look
            assert.truthy(H.wait_until(function()
                local d = sample(gw)
                local fl = by(d.routes, "route", "127.0.0.1:" .. gw.port .. " /pay/")
                local w = by(d.upstreams, "name", "web")
                return fl and fl.idempotency.replayed > 0 and w and w.retries > 0
            end, 30), "the load never produced retries and replays")
            local doc1, seq1 = check(page())
            local pay = by(doc1.routes, "route", "127.0.0.1:" .. gw.port .. " /pay/")
            assert.truthy(pay.idempotency.replayed > 0)
            -- the master samples once a second: the second look comes after a newer sample exists
            assert.truthy(sample_after(gw, seq1), "the master took no newer sample")
            local doc2, seq2 = check(page())
            assert.truthy(seq2 > seq1, "the second page load showed no newer sample")
            assert.truthy(by(doc2.upstreams, "name", "web").requests > by(doc1.upstreams, "name", "web").requests)
        end)
        loader:stop()
        H.rm_rf(dir)
        assert(ok, err)
    end)

    it("serves a status page that references nothing outside itself", function()
        local r = assert(admin(gw, "/status"))
        assert.equal(200, r.status)
        assert.matches("^text/html", r.headers["content-type"])
        local html = r.body
        assert.matches("<html", html)
        assert.is_nil(html:find("<script[^>]-%ssrc%s*="), "a <script src> in the page")
        assert.is_nil(html:find("<link[^>]-%shref%s*="), "a <link href> in the page")
        assert.is_nil(html:find("@import", 1, true), "a CSS @import in the page")
        -- the SVG namespace is a name, never fetched; every other scheme-ful or scheme-relative URL is out
        local stripped = html:gsub(lit('"http://www.w3.org/2000/svg"'), '""')
        assert.is_nil(stripped:find("https?://"), "an absolute URL in the page: " .. (stripped:match(".-(https?://%S+)") or ""))
        for attr, v in stripped:gmatch("%s(%a+)%s*=%s*[\"']([^\"']*)") do
            if attr == "src" or attr == "href" or attr == "action" then
                assert.is_nil(v:find("^//"), attr .. "=" .. v)
            end
        end
        assert.is_nil(stripped:find("url%(%s*['\"]?//"), "a scheme-relative url() in the page")
        -- and the only thing it asks for is /status.json on the same origin
        for target in stripped:gmatch("open%(%s*\"GET\"%s*,%s*\"([^\"]*)\"") do
            assert.equal("/status.json", target)
        end
    end)
end)

---------------------------------------------------------------------------
-- /status.json's samples on a gateway of its own (so "right after start" means it)
---------------------------------------------------------------------------

local SMALL = [[
worker_processes 1;
error_log logs/error.log info;
http {
    admin_listen 127.0.0.1:{{PORT2}};
    {{ALLOW}}
    upstream u { server {{UPSTREAM}}; }
    server { listen 127.0.0.1:{{PORT}}; location / { proxy_pass http://u; } }
}
]]

describe("/status.json", function()
    local up, gw

    before_each(function() up = H.start_upstream() end)
    after_each(function()
        if gw then gw:stop() end
        gw = nil
        if up then up:stop() end
    end)

    it("answers 503 or a sample right after start, then samples with a growing seq, each kept and fetchable", function()
        gw = H.start_gateway({ conf = SMALL, upstream = up, vars = { ALLOW = "" } })
        local first = H.wait_until(function()
            local r = admin(gw, "/status.json", { timeout = 1 })
            return r
        end, 15)
        assert.truthy(first, ctx(gw, "the admin listener did not answer"))
        if first.status == 503 then
            assert.equal("1", first.headers["retry-after"])
            assert.truthy(json.decode(first.body).error, first.body)
        else
            assert.equal(200, first.status, first.body)
        end
        -- poll until the first sample
        local r1 = H.wait_until(function()
            local r = admin(gw, "/status.json")
            return r and r.status == 200 and r or nil
        end, 15)
        assert.truthy(r1, ctx(gw, "no sample within 5 s of the start"))
        local d1 = json.decode(r1.body)
        assert.is_number(d1.seq)
        assert.equal(10, d1.window_seconds)
        assert.equal(1, d1.generation)
        assert.truthy(d1.time >= d1.started)
        assert.same({ "u" }, { d1.upstreams[1].name })
        assert.equal("127.0.0.1:" .. gw.port .. " /", d1.routes[1].route)

        local d2 = sample_after(gw, d1.seq)
        assert.truthy(d2.seq > d1.seq)
        assert.truthy(d2.time > d1.time)
        -- the earlier sample is still kept: the same JSON, byte for byte
        local again = assert(admin(gw, "/status.json?seq=" .. d1.seq))
        assert.equal(200, again.status)
        assert.equal(r1.body, again.body)
        local latest = assert(admin(gw, "/status.json?seq=" .. d2.seq))
        assert.equal(200, latest.status)
        assert.equal(d2.seq, json.decode(latest.body).seq)

        local gone = assert(admin(gw, "/status.json?seq=999999"))
        assert.equal(404, gone.status)
        assert.matches("^application/json", gone.headers["content-type"])
        assert.truthy(json.decode(gone.body).error, gone.body)
    end)

    it("answers 403 to a client admin_allow does not list, even on loopback, and 200 to one it lists", function()
        gw = H.start_gateway({ conf = SMALL, upstream = up, vars = { ALLOW = "admin_allow 10.0.0.0/8;" } })
        local r = H.wait_until(function() return admin(gw, "/healthz", { timeout = 1 }) end, 15)
        assert.truthy(r, ctx(gw))
        assert.equal(403, r.status)
        for _, p in ipairs({ "/metrics", "/status", "/status.json", "/readyz", "/" }) do
            assert.equal(403, assert(admin(gw, p)).status, p)
        end
        gw:stop()

        gw = H.start_gateway({ conf = SMALL, upstream = up, vars = { ALLOW = "admin_allow 127.0.0.1/32;" } })
        r = H.wait_until(function() return admin(gw, "/healthz", { timeout = 1 }) end, 15)
        assert.truthy(r, ctx(gw))
        assert.equal(200, r.status)
        assert.equal(200, assert(admin(gw, "/metrics")).status)
    end)

    it("answers 400 to a seq= that is not only digits (empty, letters, trailing junk, after another parameter)", function()
        gw = H.start_gateway({ conf = SMALL, upstream = up, vars = { ALLOW = "" } })
        -- once there is a sample, a query that names no seq (or a good one) gets it: 200, not 503
        local latest = sample(gw)
        for _, q in ipairs({ "?seq=", "?seq=abc", "?seq=1x", "?x=1&seq=abc", "?seq=-1", "?x=1&seq=" }) do
            local r = assert(admin(gw, "/status.json" .. q))
            assert.equal(400, r.status, q .. ": " .. r.body)
            assert.matches("^application/json", r.headers["content-type"], q)
            assert.truthy(json.decode(r.body).error, q .. ": " .. r.body)
        end
        for _, q in ipairs({ "?x=2", "?seq=" .. latest.seq, "?x=1&seq=" .. latest.seq, "?seq=" .. latest.seq .. "&x=1" }) do
            local r = assert(admin(gw, "/status.json" .. q))
            assert.equal(200, r.status, q .. ": " .. r.body)
            assert.is_number(json.decode(r.body).seq, q)
        end
        assert.equal(latest.seq, json.decode(assert(admin(gw, "/status.json?x=1&seq=" .. latest.seq)).body).seq)
    end)
end)

---------------------------------------------------------------------------
-- readiness across a reload and a graceful quit
---------------------------------------------------------------------------

local READY = [[
worker_processes 2;
worker_shutdown_timeout 60s;
error_log logs/error.log info;
pid logs/ricochet.pid;
http {
    admin_listen 127.0.0.1:{{PORT2}};
    upstream u { server {{UPSTREAM}}; }
    server {
        listen 127.0.0.1:{{PORT}};
        location / { proxy_pass http://u; proxy_read_timeout 60s; retry_timeout 60s; per_try_timeout 60s;
                     proxy_set_header X-Gen {{GEN}}; }
    }
}
]]

describe("/readyz", function()
    local up, gw

    before_each(function()
        up = H.start_upstream()
        -- held 8 s: every look of these specs comes while it is in flight, however busy the machine
        up:program({ default = { status = 200, body = "slow answer", delay_ms = 8000 } })
        gw = H.start_gateway({ conf = READY, upstream = up, vars = { GEN = "one" } })
        assert(H.wait_until(function() return accepts(gw.port2) end, 20), ctx(gw))
    end)

    after_each(function()
        if gw then gw:stop() end
        if up then up:stop() end
    end)

    -- A proxied request the slow upstream holds: sent, and seen upstream.
    local function in_flight(path)
        local before = up:stats().hits
        local conn = assert(H.connect(gw.port))
        assert(conn:send(H.build_request(gw.port, { path = path })))
        assert.truthy(H.wait_until(function() return up:stats().hits > before end, 20), ctx(gw, "no hit upstream"))
        return conn
    end

    it("stays 200 during a reload, while the old generation drains an in-flight request", function()
        local r, d = admin_json(gw, "/readyz")
        assert.equal(200, r.status)
        assert.same({ ready = true }, d)
        local conn = in_flight("/held-over-reload")
        H.write_file(gw.conf_path, gw:render(READY, { GEN = "two" }))
        assert.is_true(gw:signal("HUP"))
        local statuses, generation = {}, nil
        local t0 = now()
        for _ = 1, 1500 do
            local rr = admin(gw, "/readyz", { timeout = 2 })
            statuses[#statuses + 1] = rr and rr.status or "none"
            local hr, hd = admin_json(gw, "/healthz")
            if hr.status == 200 and hd and hd.generation == 2 then generation = 2 break end
            if now() - t0 > 30 then break end
            H.sleep(0.02)
        end
        assert.equal(2, generation, ctx(gw, "the reload never reached generation 2"))
        -- the old worker still drains the held request: still ready
        for _ = 1, 3 do statuses[#statuses + 1] = assert(admin(gw, "/readyz")).status end
        for i, s in ipairs(statuses) do
            assert.equal(200, s, ("readyz answer %d of %d during the reload"):format(i, #statuses))
        end
        local resp, err = conn:read_response({ timeout = 30 })
        assert.truthy(resp, ctx(gw, err))
        assert.equal(200, resp.status)
        assert.equal("slow answer", resp.body)
        conn:close()
    end)

    it("answers 503 on a new connection during a graceful quit, while the in-flight request completes", function()
        local conn = in_flight("/held-over-quit")
        assert.is_true(gw:signal("QUIT"))
        local nr
        assert.truthy(H.wait_until(function()
            nr = admin(gw, "/readyz", { timeout = 1 })
            return nr and nr.status == 503
        end, 10), ctx(gw, "readyz never answered 503 after SIGQUIT: " .. tostring(nr and nr.status)))
        local doc = json.decode(nr.body)
        assert.equal(false, doc.ready)
        assert.equal("shutting_down", doc.reason)
        assert.equal("5", nr.headers["retry-after"])
        -- still while the request is held: a fresh connection is answered too, and then closed
        local probe = assert(H.connect(gw.port2))
        local pr, perr = probe:request({ path = "/readyz" })
        assert.truthy(pr, ctx(gw, perr))
        assert.equal(503, pr.status)
        assert.truthy(probe:closed(10), "the admin connection stayed open during the graceful quit")
        probe:close()
        assert.is_true(gw:alive(), "the master left with a request in flight")

        local resp, err = conn:read_response({ timeout = 30 })
        assert.truthy(resp, ctx(gw, err))
        assert.equal(200, resp.status)
        assert.equal("slow answer", resp.body)
        conn:close()
        assert.truthy(gw:wait_exit(30), ctx(gw, "the gateway did not exit after its last request"))
        assert.equal(0, gw.exit_code)
    end)
end)

---------------------------------------------------------------------------
-- configuration errors: ricochet -t -c FILE
---------------------------------------------------------------------------

describe("admin_listen and admin_allow in the config", function()
    local dir
    local ports = H.free_ports(3)
    local port, aport, aport2 = ports[1], ports[2], ports[3]

    setup(function() dir = H.mkdtemp("adminconf") end)
    teardown(function() H.rm_rf(dir) end)

    -- The config: the server on lines 3-7, `lines` from line 8 on, one a line.
    local function conf(lines)
        local t = {
            "worker_processes 1;",                                 -- 1
            "http {",                                              -- 2
            "    upstream u { server 127.0.0.1:9; }",              -- 3
            "    server {",                                        -- 4
            "        listen 127.0.0.1:" .. port .. ";",            -- 5
            "        location / { proxy_pass http://u; }",         -- 6
            "    }",                                               -- 7
        }
        for _, l in ipairs(lines) do t[#t + 1] = "    " .. l end
        t[#t + 1] = "}"
        return table.concat(t, "\n") .. "\n"
    end

    local n = 0
    local function test(lines)
        n = n + 1
        local path = ("%s/c%d.conf"):format(dir, n)
        H.write_file(path, conf(lines))
        local code, out = H.run({ H.bin(), "-p", dir, "-t", "-c", path })
        return code, out, path
    end

    local BAD = {
        { "a non-loopback admin_listen without admin_allow", { "admin_listen 0.0.0.0:" .. aport .. ";" }, 8,
            "is not a loopback address: add \"admin_allow" },
        { "another non-loopback address", { "admin_listen 10.1.2.3:" .. aport .. ";" }, 8, "is not a loopback address" },
        { "admin_listen on a listen's address", { "admin_listen 127.0.0.1:" .. port .. ";" }, 8,
            "is also the address of the listen at " },
        { "two admin_listen", { "admin_listen 127.0.0.1:" .. aport .. ";", "admin_listen 127.0.0.1:" .. aport2 .. ";" },
            9, "duplicate" },
        { "admin_allow without admin_listen", { "admin_allow 10.0.0.0/8;" }, 8, "without \"admin_listen\"" },
        { "a prefix length over 32", { "admin_listen 127.0.0.1:" .. aport .. ";", "admin_allow 10.0.0.0/33;" }, 9,
            "10.0.0.0/33" },
        { "something that is no address", { "admin_listen 127.0.0.1:" .. aport .. ";", "admin_allow 127.0.0.1/32 not-an-ip;" },
            9, "not%-an%-ip" },
    }

    it("refuses each bad admin setting with FILE:LINE: and a non-zero exit", function()
        for _, case in ipairs(BAD) do
            local code, out, path = test(case[2])
            assert.not_equal(0, code, case[1] .. ":\n" .. out)
            assert.truthy(out:find(lit(path) .. ":" .. case[3] .. ": [^\n]*" .. case[4]),
                case[1] .. ": expected " .. path .. ":" .. case[3] .. ": ..." .. case[4] .. ", got:\n" .. out)
        end
    end)

    it("accepts a non-loopback admin_listen with admin_allow, and the two-line loopback forms", function()
        for _, lines in ipairs({
            { "admin_listen 0.0.0.0:" .. aport .. ";", "admin_allow 10.0.0.0/8;" },
            { "admin_listen 127.0.0.1:" .. aport .. ";", "admin_allow 127.0.0.1/32 ::1/128 10.0.0.1;" },
            { "admin_listen 127.0.0.1:" .. aport .. ";" },
        }) do
            local code, out = test(lines)
            assert.equal(0, code, table.concat(lines, " ") .. ":\n" .. out)
            assert.matches("test is successful", out)
        end
    end)
end)

---------------------------------------------------------------------------
-- daemon on: the master /healthz reports is the process that forked off, the one in the pid file
---------------------------------------------------------------------------

local DAEMON = [[
daemon on;
worker_processes 1;
error_log logs/error.log info;
pid logs/ricochet.pid;
http {
    admin_listen 127.0.0.1:{{PORT2}};
    upstream u { server {{UPSTREAM}}; }
    server { listen 127.0.0.1:{{PORT}}; location / { proxy_pass http://u; } }
}
]]

describe("daemon on", function()
    it("answers /healthz 200 with the pid file's master_pid (not the process that forked it)", function()
        local up = H.start_upstream()
        local gw = H.start_gateway({ conf = DAEMON, upstream = up, wait = false })
        local pid_path = gw.prefix .. "/logs/ricochet.pid"
        local daemon_pid
        local function pid_in_file()
            return tonumber((H.read_file(pid_path) or ""):match("^%s*(%d+)"))
        end
        local ok, err = pcall(function()
            -- the process we started forks the master off and leaves at once
            assert.equal(0, gw:wait_exit(5), ctx(gw, "the launching process did not exit 0"))
            daemon_pid = H.wait_until(function()
                local p = pid_in_file()
                return p and H.pid_alive(p) and p or nil
            end, 15)
            assert.truthy(daemon_pid, ctx(gw, "no live master in the pid file"))
            assert.not_equal(gw.pid, daemon_pid)
            local doc, last
            H.wait_until(function()
                local r = admin(gw, "/healthz", { timeout = 1 })
                last = r
                if r and r.status == 200 then doc = json.decode(r.body) end
                return doc and doc.workers == 1
            end, 15)
            assert.truthy(doc, ctx(gw, "/healthz never answered 200: " .. tostring(last and last.status) .. " "
                .. tostring(last and last.body)))
            assert.equal("ok", doc.status)
            assert.equal(daemon_pid, doc.master_pid)
            assert.equal(1, doc.workers)
            -- and it proxies
            up:program({ default = { status = 200, body = "daemon ok" } })
            local r = assert(H.request(gw.port, { path = "/d" }))
            assert.equal(200, r.status)
            assert.equal("daemon ok", r.body)
        end)
        -- the daemon is no child of ours: stop it through its pid file's pid, bounded, SIGKILL as the last resort
        daemon_pid = daemon_pid or pid_in_file()
        if daemon_pid and H.pid_alive(daemon_pid) then
            local kids = H.descendants(daemon_pid)
            os.execute("kill -TERM " .. daemon_pid .. " 2>/dev/null")
            if not H.wait_until(function() return not H.pid_alive(daemon_pid) end, 5) then
                for _, k in ipairs(H.descendants(daemon_pid)) do kids[#kids + 1] = k end
                os.execute("kill -KILL " .. daemon_pid .. " 2>/dev/null")
            end
            H.wait_until(function()
                for _, k in ipairs(kids) do if H.pid_alive(k) then return false end end
                return true
            end, 2)
            for _, k in ipairs(kids) do
                if H.pid_alive(k) then os.execute("kill -KILL " .. k .. " 2>/dev/null") end
            end
        end
        local log = gw:log()
        gw:stop()
        up:stop()
        assert(ok, tostring(err) .. "\n" .. log)
        assert.is_false(H.pid_alive(daemon_pid), "the daemon outlived SIGTERM")
    end)
end)

---------------------------------------------------------------------------
-- a reload: only the new generation answers on the admin address, while an old worker still drains
---------------------------------------------------------------------------

local RELOADED = [[
worker_processes 2;
worker_shutdown_timeout 60s;
error_log logs/error.log info;
pid logs/ricochet.pid;
http {
    admin_listen 127.0.0.1:{{PORT2}};
    upstream u { server {{UPSTREAM}}; }
    server {
        listen 127.0.0.1:{{PORT}};
        location / { proxy_pass http://u; proxy_read_timeout 60s; retry_timeout 60s; per_try_timeout 60s; }
        {{EXTRA}}
    }
}
]]

describe("the admin listener after a reload", function()
    local up, gw

    before_each(function()
        up = H.start_upstream()
        gw = H.start_gateway({ conf = RELOADED, upstream = up, vars = { EXTRA = "" } })
        assert(H.wait_until(function() return accepts(gw.port2) end, 20), ctx(gw))
    end)

    after_each(function()
        if gw then gw:stop() end
        if up then up:stop() end
    end)

    it("serves the new generation's /metrics and /healthz on every new connection while an old worker drains", function()
        up:program({ default = { status = 200, body = "ok\n" },
            -- held 8 s: the old workers still drain them after the reload and the ten scrapes, however busy
            -- the machine
            routes = { ["/held"] = { default = { status = 200, body = "slow answer", delay_ms = 8000 } } } })
        assert.truthy(H.wait_until(function() return #gw:workers() == 2 end, 20), ctx(gw))
        local old = gw:workers()
        local new_label = 'route="127.0.0.1:' .. gw.port .. ' /newroute"'
        assert.is_nil(assert(admin(gw, "/metrics")).body:find(new_label, 1, true))
        -- proxied requests the slow upstream holds, each on a fresh connection (so likely on both old workers)
        local before = up:stats().hits
        local conns = {}
        for i = 1, 6 do
            conns[i] = assert(H.connect(gw.port))
            assert(conns[i]:send(H.build_request(gw.port, { path = "/held" })))
        end
        assert.truthy(H.wait_until(function() return up:stats().hits >= before + #conns end, 20),
            ctx(gw, "the held requests did not all reach the upstream"))

        local code, out = gw:reload(RELOADED, { EXTRA = "location /newroute { proxy_pass http://u; }" })
        assert.equal(0, code, ctx(gw, out))
        local function old_alive()
            local n = 0
            for _, p in ipairs(old) do if H.pid_alive(p) then n = n + 1 end end
            return n
        end
        assert.truthy(old_alive() >= 1, ctx(gw, "no old worker left to drain the held request"))
        for i = 1, 10 do
            local m = assert(H.request(gw.port2, { path = "/metrics", headers = { { "Connection", "close" } } }))
            assert.equal(200, m.status)
            assert.truthy(m.body:find(new_label, 1, true),
                ("scrape %d of 10 after the reload has no %s series (an old worker answered)"):format(i, new_label))
            local _, doc = admin_json(gw, "/healthz")
            assert.truthy(doc, "scrape " .. i .. ": /healthz is no JSON")
            assert.equal(2, doc.generation, "scrape " .. i .. ": /healthz from generation " .. tostring(doc.generation))
        end
        -- all of that while the old worker still held the request: the check was not vacuous
        assert.truthy(old_alive() >= 1, "the old workers were gone before the scrapes ended")
        for i, conn in ipairs(conns) do
            local resp, err = conn:read_response({ timeout = 40 })
            assert.truthy(resp, ctx(gw, "held request " .. i .. ": " .. tostring(err)))
            assert.equal(200, resp.status)
            assert.equal("slow answer", resp.body)
            conn:close()
        end
    end)
end)

---------------------------------------------------------------------------
-- out of descriptors: the admin listener must not leave the proxy's accepting paused
---------------------------------------------------------------------------

local FEWFDS = [[
worker_processes 1;
error_log logs/error.log info;
http {
    admin_listen 127.0.0.1:{{PORT2}};
    upstream u { server {{UPSTREAM}} max_fails=0; }
    server { listen 127.0.0.1:{{PORT}}; location / { proxy_pass http://u; } }
}
]]

describe("the admin listener out of descriptors", function()
    local up, gw, dir
    local held = {}

    before_each(function()
        up = H.start_upstream()
        up:program({ default = { status = 200, body = "ok\n" } })
        dir = H.mkdtemp("fewfds")
        -- the gateway under `ulimit -n 48`: a wrapper that lowers the limit and execs the binary (same pid)
        local wrap = dir .. "/ricochet-48fds"
        H.write_file(wrap, "#!/bin/sh\nulimit -n 48 || exit 99\nexec " .. H.shell_quote(H.bin()) .. ' "$@"\n')
        assert.equal(0, (H.run({ "chmod", "755", wrap })))
        gw = H.start_gateway({ conf = FEWFDS, upstream = up, bin = wrap })
        assert(H.wait_until(function() return accepts(gw.port2) end, 20), ctx(gw))
    end)

    after_each(function()
        for _, c in ipairs(held) do c:close() end
        held = {}
        if gw then gw:stop() end
        if up then up:stop() end
        H.rm_rf(dir)
    end)

    it("takes proxy connections again once the admin connections that used every descriptor close", function()
        -- a worker serves (the master binds the sockets before it forks: accepting proves nothing)
        assert.equal(200, assert(H.request(gw.port, { path = "/before" })).status)
        local w = H.wait_until(function() return gw:workers()[1] end, 15)
        assert.truthy(w, ctx(gw))
        assert.matches("Max open files%s+48%s", H.read_file("/proc/" .. w .. "/limits") or "")
        -- half-sent admin requests (no blank line yet), more than the worker has descriptors for
        for _ = 1, 80 do
            local c = H.connect(gw.port2, { timeout = 1 })
            if not c then break end
            c:send("GET /healthz HTTP/1.1\r\nHost: a\r\n")
            held[#held + 1] = c
        end
        assert.truthy(H.wait_until(function()
            return gw:log():find("accept4() failed on 127.0.0.1:" .. gw.port2 .. " (", 1, true)
        end, 20), ctx(gw, "the admin listener never ran out of descriptors (" .. #held .. " connections held)"))
        -- a proxy request now: its accept fails too (it may never be answered)
        local during = assert(H.connect(gw.port))
        assert(during:send(H.build_request(gw.port, { path = "/during" })))
        held[#held + 1] = during
        assert.truthy(H.wait_until(function()
            return gw:log():find("accept4() failed on 127.0.0.1:" .. gw.port .. " (", 1, true)
        end, 20), ctx(gw, "the proxy listener never met the descriptor limit"))
        for _, c in ipairs(held) do c:close() end
        held = {}
        local last
        local ok = H.wait_until(function()
            local r, err = H.request(gw.port, { path = "/after", timeout = 2 })
            last = r and r.status or err
            return r and r.status == 200
        end, 20)
        assert.truthy(ok, ctx(gw, "the proxy never took a request again after the admin connections closed: "
            .. tostring(last)))
        assert.is_true(gw:alive())
    end)
end)
