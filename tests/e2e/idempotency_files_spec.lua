-- The LMDB idempotency store's files while gateways run: a reload that raises size= while a keyed request is
-- upstream, two gateways with different size= on one file, the data file truncated or emptied under running
-- workers, its lock file deleted, and a lock file the gateway may not write. Each counts executions at the
-- upstream: a key runs once, or its requests are refused (503) with a log line; never a fresh store, never a
-- crashed worker.
package.path = "tests/e2e/?.lua;" .. package.path
local H = require("helpers")
local I = require("idem_helpers")
local lfs = require("lfs")
local socket = require("socket")

local ctx = H.context
local problem_type = I.problem_type
local UNAVAILABLE = "urn:ricochet:problem:idempotency-store-unavailable"

local CONF = [[
worker_processes {{WORKERS}};
pid logs/ricochet.pid;
error_log logs/error.log info;
http {
    {{RECOVER}}
    upstream up { server {{UPSTREAM}}; retry_budget off; }
    upstream held { server {{HELD}}; retry_budget off; }
    server {
        listen 127.0.0.1:{{PORT}};
        server_name gw;
        idempotency_store lmdb:{{STORE}} size={{SIZE}};
        location /held/ { proxy_pass http://held; }
        location / { proxy_pass http://up; }
    }
}
]]

local function file_size(path) return lfs.attributes(path, "size") end
local function exists(path) return lfs.attributes(path, "mode") ~= nil end

-- Truncates a file in place (same inode) to its first n bytes.
local function truncate(path, n)
    local f = assert(io.open(path, "rb"))
    local head = f:read(n) or ""
    f:close()
    H.write_file(path, head)
    assert(file_size(path) == n, "truncate " .. path)
end

-- How many requests the upstream saw with this Idempotency-Key.
local function runs(up, key)
    local n = 0
    for _, hit in ipairs(up:hits({ bodies = false })) do
        if H.hit_values(hit, "Idempotency-Key")[1] == key then n = n + 1 end
    end
    return n
end

local function assert_no_worker_died(gw)
    local log = gw:log()
    local died = log:match("[^\n]*exited on signal[^\n]*") or log:match("[^\n]*exited with code[^\n]*")
    assert.is_nil(died, ctx(gw))
end

describe("the LMDB store's files at run time", function()
    local up, dir, store, held
    local gws = {}

    local function start(opts)
        opts = opts or {}
        local gw = H.start_gateway({ conf = CONF, upstream = up, vars = {
            STORE = store, SIZE = opts.size or "4m", WORKERS = opts.workers or 1,
            HELD = opts.held or up.addr, RECOVER = "",
        } })
        gws[#gws + 1] = gw
        return gw
    end

    setup(function() up = H.start_upstream() end)
    teardown(function() if up then up:stop() end end)

    before_each(function()
        up:reset()
        dir = H.mkdtemp("idemfiles")
        store = dir .. "/s.mdb"
        gws = {}
    end)

    after_each(function()
        local failed
        for _, gw in ipairs(gws) do
            local ok, err = pcall(gw.stop, gw) -- under ASan: fails on any sanitizer report
            failed = failed or (not ok and err)
        end
        if held then held:close(); held = nil end
        if dir then os.execute("rm -rf " .. H.shell_quote(dir)) end
        if failed then error(failed, 0) end
    end)

    -- n keyed POSTs of answers of `size` bytes through port, each run once; returns their keys.
    local function fill(port, tag, n, size)
        up:program({ default = { status = 201, body = H.text_body(size, 7) } })
        local keys = {}
        for i = 1, n do
            keys[i] = I.new_key(tag)
            local r = assert(I.post(port, "/fill/" .. i, keys[i]))
            assert.equal(201, r.status, r.body)
        end
        return keys
    end

    it("a reload raising size= while a keyed request is upstream: its answer is stored, it ran once", function()
        held = assert(socket.bind("127.0.0.1", 0))
        local _, hport = held:getsockname()
        local gw = start({ size = "1m", held = "127.0.0.1:" .. hport })
        -- a keyed request held at the upstream (this spec answers it when it chooses)
        local c = assert(H.connect(gw.port))
        assert(c:send(H.build_request(gw.port, { method = "POST", path = "/held/1", body = '{"a":1}',
            headers = { { "Idempotency-Key", "held-1" }, { "Content-Type", "application/json" } } })))
        held:settimeout(20)
        local conn = assert(held:accept(), "the held request never reached its upstream")
        conn:settimeout(10)
        for _ = 1, 100 do
            local line = assert(conn:receive("*l"))
            if line == "" then break end
        end
        -- the map is raised, and the new generation writes well past the old map's end
        local code, out = gw:reload(CONF, { SIZE = "4m" })
        assert.equal(0, code, out)
        fill(gw.port, "grow", 60, 30000)
        assert.truthy(file_size(store) >= 4 * 1024 * 1024)
        -- the held request's answer, settled by the old generation's worker
        assert(conn:send("HTTP/1.1 201 Created\r\nContent-Type: text/plain\r\nContent-Length: 11\r\n\r\nheld answer"))
        conn:close()
        local first = assert(c:read_response({ timeout = 10 }))
        c:close()
        assert.equal(201, first.status, ctx(gw))
        assert.equal("held answer", first.body)
        local again = assert(I.repeat_post(gw.port, "/held/1", "held-1", '{"a":1}'))
        assert.equal(201, again.status, ctx(gw, again.body))
        assert.equal("held answer", again.body)
        assert.equal("true", again.headers["idempotent-replayed"], ctx(gw))
        held:settimeout(0)
        assert.is_nil(held:accept(), "the held key ran a second time")
        assert.is_nil(gw:log():find("lost", 1, true), ctx(gw))
        assert_no_worker_died(gw)
    end)

    it("two gateways with different size= on one file both serve keyed requests and dedupe each other's", function()
        local small = start({ size = "1m" })
        local big = start({ size = "4m" })
        local big_keys = fill(big.port, "big", 60, 30000) -- past the small map's end
        local answer = H.text_body(30000, 7)
        -- the small one replays the big one's keys, and runs new ones
        for _, i in ipairs({ 1, 30, 60 }) do
            local r = assert(I.repeat_post(small.port, "/fill/" .. i, big_keys[i])) -- its settle may trail its answer
            assert.equal(201, r.status, ctx(small, r.body:sub(1, 300)))
            assert.equal("true", r.headers["idempotent-replayed"], ctx(small))
            assert.equal(answer, r.body)
        end
        local small_keys = fill(small.port, "small", 5, 1000)
        for i, key in ipairs(small_keys) do
            local r = assert(I.repeat_post(big.port, "/fill/" .. i, key))
            assert.equal("true", r.headers["idempotent-replayed"], ctx(big, r.body))
        end
        -- a third, small again, started after the file grew: the big one keeps writing past 1m
        local late = start({ size = "1m" })
        local more = fill(big.port, "more", 10, 30000)
        local r = assert(I.repeat_post(late.port, "/fill/10", more[10]))
        assert.equal("true", r.headers["idempotent-replayed"], ctx(late, r.body))
        for _, key in ipairs(big_keys) do assert.equal(1, runs(up, key)) end
        for _, key in ipairs(small_keys) do assert.equal(1, runs(up, key)) end
        for _, gw in ipairs({ small, big, late }) do
            assert.is_nil(gw:log():find("[alert]", 1, true), ctx(gw))
            assert_no_worker_died(gw)
        end
    end)

    -- After the store's file changed under the gateway: keyed requests get 503 (a stored key too, which does
    -- not run again), an unkeyed one is served, by the same worker, and the log says what changed.
    local function assert_refused(gw, pid, stored, stored_path, what)
        local before = #up:hits()
        for _, req in ipairs({ { stored, stored_path }, { I.new_key("after"), "/new" } }) do
            local r = assert(I.post(gw.port, req[2], req[1]))
            assert.equal(503, r.status, ctx(gw, r.body:sub(1, 300)))
            assert.equal(UNAVAILABLE, problem_type(r), ctx(gw, r.body))
        end
        assert.equal(before, #up:hits(), "a keyed request ran on a changed store")
        up:program({ default = { status = 200, body = "no key needed" } })
        local plain = assert(H.request(gw.port, { method = "GET", path = "/plain" }))
        assert.equal(200, plain.status, ctx(gw))
        assert.equal("no key needed", plain.body)
        assert.same({ pid }, gw:workers(), ctx(gw))
        local alert = H.wait_until(function()
            return (H.read_file(gw.prefix .. "/logs/error.log") or ""):match("[^\n]*%[alert%][^\n]*")
        end, 5)
        assert.truthy(alert, ctx(gw))
        assert.truthy(alert:find(store, 1, true), alert)
        assert.truthy(alert:find(what, 1, true), alert)
        assert_no_worker_died(gw)
    end

    it("a data file truncated to half under a running worker: keyed requests are refused, never a crash", function()
        local gw = start({ size = "1m" })
        local pid = gw:workers()[1]
        local keys = fill(gw.port, "half", 20, 20000)
        truncate(store, math.floor(file_size(store) / 2))
        assert_refused(gw, pid, keys[20], "/fill/20", "truncated")
        assert.equal(1, runs(up, keys[20]))
    end)

    it("a data file emptied under a running worker: never a fresh store, never a crash", function()
        local gw = start({ size = "1m" })
        local pid = gw:workers()[1]
        local keys = fill(gw.port, "zero", 10, 2000)
        truncate(store, 0)
        assert_refused(gw, pid, keys[5], "/fill/5", "truncated to 0 bytes")
        -- a worker that starts now (killed and respawned) opens no store in its place
        assert(os.execute("kill -KILL " .. pid))
        local respawned = H.wait_until(function()
            local w = gw:workers()
            return #w == 1 and w[1] ~= pid and w[1]
        end, 10)
        assert.truthy(respawned, ctx(gw))
        local r = assert(I.post(gw.port, "/fill/5", keys[5]))
        assert.equal(503, r.status, ctx(gw, r.body:sub(1, 300)))
        assert.equal(0, file_size(store))
        assert.equal(1, runs(up, keys[5]))
        assert.truthy(gw:log():find("is not the store the master checked", 1, true), ctx(gw))
        assert.same({ respawned }, gw:workers(), ctx(gw))
    end)

    it("a lock file deleted under a running gateway: it refuses writes, a second gateway runs each key once", function()
        local first = start({ size = "1m" })
        local pid = first:workers()[1]
        local keys = fill(first.port, "lock", 3, 100)
        os.remove(store .. "-lock")
        assert_refused(first, pid, keys[1], "/fill/1", "lock file " .. store .. "-lock")
        -- a second gateway on the file makes a new lock file: the first stays refused, the second runs each
        -- key of 20 duplicate pairs once
        local second = start({ size = "1m" })
        up:program({ default = { status = 201, body = "once" } })
        for i = 1, 20 do
            local key = I.new_key("pair")
            local a = assert(I.post(first.port, "/pair/" .. i, key))
            local b = assert(I.post(second.port, "/pair/" .. i, key))
            assert.equal(503, a.status, ctx(first, a.body))
            assert.equal(201, b.status, ctx(second, b.body))
            assert.equal(1, runs(up, key))
        end
        assert.equal(1, runs(up, keys[1]))
        assert_no_worker_died(first)
        assert_no_worker_died(second)
    end)

    it("a lock file the gateway may not write is said as that: recover rename moves nothing", function()
        fill(start({ size = "1m" }).port, "perm", 3, 100)
        gws[1]:stop()
        local conf = dir .. "/r.conf"
        H.write_file(conf, (CONF:gsub("{{([%w_]+)}}", {
            WORKERS = "1", RECOVER = "idempotency_store_recover rename;", UPSTREAM = up.addr, HELD = up.addr,
            PORT = tostring(H.free_port()), STORE = store, SIZE = "1m",
        })))
        local prefix = dir .. "/p"
        lfs.mkdir(prefix)
        lfs.mkdir(prefix .. "/logs")
        local as = {}
        local _, id_out = H.run({ "id", "-u" })
        local uid = tonumber(id_out:match("%d+"))
        if uid == 0 then
            -- root opens any file whatever its mode: the gateway runs as nobody, the lock file stays root's
            assert(os.execute(("chown -R nobody %s && chown root %s && chmod 644 %s"):format(
                H.shell_quote(dir), H.shell_quote(store .. "-lock"), H.shell_quote(store .. "-lock"))))
            as = { "setpriv", "--reuid=nobody", "--regid=nogroup", "--clear-groups" }
        else
            assert(os.execute("chmod 444 " .. H.shell_quote(store .. "-lock")))
        end
        local function gateway(args)
            local argv = { "timeout", "30" }
            for _, a in ipairs(as) do argv[#argv + 1] = a end
            for _, a in ipairs({ H.bin(), "-p", prefix, "-c", conf }) do argv[#argv + 1] = a end
            for _, a in ipairs(args) do argv[#argv + 1] = a end
            return H.run(argv, { timeout = 40 })
        end
        local reason = "cannot open lock file " .. store .. "-lock: Permission denied"
        local tcode, tout = gateway({ "-t" })
        assert.equal(1, tcode, tout)
        assert.truthy(tout:find(reason, 1, true), tout)
        assert.is_nil(tout:find("damaged", 1, true), tout)
        local code, out = gateway({})
        assert.is_not.equal(0, code, out)
        assert.truthy(out:find(reason, 1, true), out)
        assert.truthy(exists(store))
        for name in lfs.dir(dir) do
            assert.is_nil(name:find("damaged", 1, true), "moved aside: " .. name)
        end
    end)
end)
