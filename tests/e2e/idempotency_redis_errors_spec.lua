-- A keyed request's settle that Redis answers with an error reply (MISCONF, NOREPLICAS, READONLY, BUSY, OOM,
-- LOADING after a restart with AOF, an ACL that refuses it): the settle waits in the worker's backlog, goes again
-- every second on the same connection, and lands once Redis takes writes again, so the repeat is a replay and the
-- upstream ran once; errors that outlast the lock make it lost, logged with the key's digest and counted in
-- /metrics. The real binary, a private redis-server per case, the fault upstream holding its answer until the
-- spec lets it go. Nothing waits on the clock: every step waits for what it needs (a log line, Redis's state).
package.path = "tests/e2e/?.lua;" .. package.path
local H = require("helpers")
local I = require("idem_helpers")
local socket = require("socket")

local ctx = H.context
local problem_type = I.problem_type

local function is_in_use(r)
    return r and r.status == 409 and problem_type(r) == "urn:ricochet:problem:idempotency-key-in-use"
end

-- The lock outlives anything a spec does while the answer is held (far from it: nothing here may lapse it),
-- and the held answer is not cut by the attempt's or the request's deadline either.
local CONF = [[
worker_processes 1;
error_log logs/error.log info;
http {
    access_log logs/access.log;
    admin_listen 127.0.0.1:{{PORT2}};
    upstream up { server {{UPSTREAM}}; retry_budget off; }
    server {
        listen 127.0.0.1:{{PORT}};
        retry_backoff 1ms 2ms;
        retry_timeout {{DEADLINE}};
        per_try_timeout {{DEADLINE}};
        idempotency_store redis://{{AUTH}}127.0.0.1:{{REDIS}};
        idempotency_lock_ttl {{LOCK_TTL}};
        location / { retry_attempts 1; proxy_pass http://up; }
    }
}
]]

-- A redis-server (extra arguments) and a gateway in front of the fault upstream; all stopped by the caller's
-- finally. opts.lock_ttl, opts.deadline, opts.auth ("user:password@").
local function start(redis_args, opts)
    opts = opts or {}
    local env = {}
    env.up = H.start_upstream()
    env.redis = H.start_redis({ args = redis_args })
    if opts.before_gateway then opts.before_gateway(env.redis) end
    env.gw = H.start_gateway({ conf = CONF, upstream = env.up, vars = {
        REDIS = env.redis.port, LOCK_TTL = opts.lock_ttl or "120s", DEADLINE = opts.deadline or "120s",
        AUTH = opts.auth or "" } })
    env.stop = function()
        if env.gw then env.gw:stop() end
        if env.redis then env.redis:stop() end
        if env.up then env.up:stop() end
    end
    return env
end

local function error_log(gw) return H.read_file(gw.prefix .. "/logs/error.log") or "" end

-- The worker is connected: a run of keyed probes in a row all answered (one in its reconnect backoff answers 503).
local function wait_ready(env)
    local streak = 0
    local ok = H.wait_until(function()
        local r = I.post(env.gw.port, "/probe", I.new_key("probe"), "{}")
        streak = (r and r.status == 200) and streak + 1 or 0
        return streak >= 3
    end, 30)
    env.up:reset()
    return ok
end

-- ricochet_idempotency_settles_lost_total of the one store, or nil when /metrics has no such line.
local function lost(gw)
    local r = H.request(gw.port2, { path = "/metrics", headers = { { "Connection", "close" } } })
    if not r or r.status ~= 200 then return nil end
    local n = r.body:match('ricochet_idempotency_settles_lost_total{store="[^"]*"} (%d+)')
    return tonumber(n)
end

-- A reply of Redis:command as text (an array's parts joined).
local function text(reply)
    return type(reply) == "table" and table.concat(reply, "\n") or tostring(reply)
end

-- Waits until a write to Redis gets an error reply starting with code (the state spoil() put it in).
local function wait_refused(redis, code)
    return H.wait_until(function()
        return text(redis:command("SET", "ricochet-spec:probe", "1")):find("^%-" .. code) ~= nil
    end, 20)
end

-- Waits until Redis takes writes again (a kill or a load may end a moment after it was asked for).
local function wait_taken(redis)
    return H.wait_until(function()
        return redis:command("SET", "ricochet-spec:probe", "1") == "+OK"
    end, 30)
end

-- The repeat with the key, once the settle landed: a 409 (still in flight) is asked again, briefly.
local function repeat_until_done(env, key, body)
    local last
    H.wait_until(function()
        last = I.post(env.gw.port, "/pay", key, body)
        if is_in_use(last) then
            H.sleep(0.1)
            return nil
        end
        return true
    end, 20)
    return last
end

-- The case: a keyed request is upstream (its answer held), spoil() makes Redis refuse writes with code, the
-- answer is let go (the client gets it at once), the worker meets code on the settle, heal() makes Redis take
-- writes again; the answer is stored: the repeat is replayed, the upstream ran once, nothing was lost.
local function settle_survives(env, code, spoil, heal)
    local gw, up = env.gw, env.up
    assert.truthy(wait_ready(env), ctx(gw, "the gateway never connected to Redis"))
    local key = I.new_key("errors-" .. code)
    local body = '{"amount":' .. #code .. '}'
    up:program({ default = { status = 201, body = '{"charged":"' .. code .. '"}', hold = "answer" } })
    local c = assert(H.connect(gw.port))
    assert(c:send(H.build_request(gw.port, { method = "POST", path = "/pay", body = body,
        headers = { { "Content-Type", "application/json" }, { "Idempotency-Key", key } } })))
    assert.truthy(H.wait_until(function() return #up:hits({ bodies = false }) == 1 end, 20),
        ctx(gw, "the keyed request never reached the upstream"))
    spoil()
    local mark = #error_log(gw)
    up:release("answer")
    local first = c:read_response({ timeout = 30 })
    c:close()
    assert.truthy(first, ctx(gw, "no answer for the request"))
    assert.equal(201, first.status, ctx(gw))
    -- the settle met the error (the base build logs it too, then drops the settle)
    local met = H.wait_until(function() return error_log(gw):sub(mark + 1):find(code, 1, true) end, 30)
    assert.truthy(met, ctx(gw, "the settle never met " .. code))
    -- a claim meets it too: the store is unavailable to that request (closed), and its key is not left locked
    local other = I.new_key("errors-claim-" .. code)
    local refused = assert(I.post(gw.port, "/pay", other, '{"other":1}'))
    assert.equal(503, refused.status, ctx(gw, refused.body))
    assert.equal("urn:ricochet:problem:idempotency-store-unavailable", problem_type(refused))
    heal()
    assert.truthy(wait_taken(env.redis), "Redis does not take writes again")
    local again = repeat_until_done(env, key, body)
    assert.truthy(again, ctx(gw, "no answer for the repeat"))
    assert.equal(201, again.status, ctx(gw, again.body))
    assert.equal('{"charged":"' .. code .. '"}', again.body, ctx(gw))
    assert.equal("true", again.headers["idempotent-replayed"], ctx(gw))
    assert.equal(1, #up:hits({ bodies = false }), ctx(gw))
    local fresh = assert(repeat_until_done(env, other, '{"other":1}'))
    assert.equal(201, fresh.status, ctx(gw, fresh.body))
    assert.is_nil(fresh.headers["idempotent-replayed"], ctx(gw))
    assert.equal(2, #up:hits({ bodies = false }), ctx(gw))
    assert.equal(0, lost(gw), ctx(gw))
    local log = error_log(gw):sub(mark + 1)
    assert.truthy(log:find("Redis answers errors: " .. code, 1, true), ctx(gw))
    assert.truthy(log:find("Redis answers again", 1, true), ctx(gw))
    assert.is_nil(log:find("lost", 1, true), ctx(gw))
end

describe("a settle that Redis answers with an error reply", function()
    it("waits out MISCONF (a failed save with stop-writes-on-bgsave-error)", function()
        -- its data directory is removed under it: the next save cannot create its file
        local data = H.mkdtemp("misconf")
        local env = start({ "--dir", data })
        finally(function()
            env.stop()
            os.execute("rm -rf " .. H.shell_quote(data))
        end)
        local r = env.redis
        settle_survives(env, "MISCONF", function()
            assert.equal("+OK", r:command("CONFIG", "SET", "save", "3600 1"))
            assert.equal("+OK", r:command("CONFIG", "SET", "stop-writes-on-bgsave-error", "yes"))
            os.execute("rm -rf " .. H.shell_quote(data))
            r:command("BGSAVE")
            assert.truthy(wait_refused(r, "MISCONF"), "Redis never refused writes after the failed save:\n"
                .. text(r:command("INFO", "persistence")))
        end, function()
            assert.equal("+OK", r:command("CONFIG", "SET", "stop-writes-on-bgsave-error", "no"))
        end)
    end)

    it("waits out NOREPLICAS (min-replicas-to-write with no replica)", function()
        local env = start({})
        finally(env.stop)
        local r = env.redis
        settle_survives(env, "NOREPLICAS", function()
            assert.equal("+OK", r:command("CONFIG", "SET", "min-replicas-to-write", "1"))
            assert.truthy(wait_refused(r, "NOREPLICAS"))
        end, function()
            assert.equal("+OK", r:command("CONFIG", "SET", "min-replicas-to-write", "0"))
        end)
    end)

    it("waits out READONLY (made a replica of a master that never answers, then promoted again)", function()
        -- a listening socket nobody accepts on: the replica's sync never starts, so it keeps its data
        local master = assert(socket.bind("127.0.0.1", 0))
        local _, master_port = master:getsockname()
        local env = start({})
        finally(function()
            env.stop()
            master:close()
        end)
        local r = env.redis
        settle_survives(env, "READONLY", function()
            assert.equal("+OK", r:command("REPLICAOF", "127.0.0.1", tostring(master_port)))
            assert.truthy(wait_refused(r, "READONLY"))
        end, function()
            assert.equal("+OK", r:command("REPLICAOF", "NO", "ONE"))
        end)
    end)

    it("waits out BUSY (another client's script that does not end)", function()
        local env = start({ "--busy-reply-threshold", "100" })
        local busy
        finally(function()
            if busy then busy:close() end
            env.stop()
        end)
        local r = env.redis
        settle_survives(env, "BUSY", function()
            busy = socket.tcp()
            busy:settimeout(5)
            assert(busy:connect("127.0.0.1", r.port))
            local script = "while true do end"
            assert(busy:send(("*3\r\n$4\r\nEVAL\r\n$%d\r\n%s\r\n$1\r\n0\r\n"):format(#script, script)))
            assert.truthy(wait_refused(r, "BUSY"))
        end, function()
            assert.equal("+OK", r:command("SCRIPT", "KILL"))
        end)
    end)

    it("waits out OOM (maxmemory reached with noeviction)", function()
        local env = start({ "--maxmemory-policy", "noeviction" })
        finally(env.stop)
        local r = env.redis
        settle_survives(env, "OOM", function()
            assert.equal("+OK", r:command("CONFIG", "SET", "maxmemory", "1"))
            assert.truthy(wait_refused(r, "OOM"))
        end, function()
            assert.equal("+OK", r:command("CONFIG", "SET", "maxmemory", "0"))
        end)
    end)

    it("waits out LOADING (Redis restarted with AOF while the request was upstream)", function()
        local env = start({ "--appendonly", "yes", "--appendfsync", "always" })
        finally(env.stop)
        local r = env.redis
        -- a dataset in the AOF's base (an RDB preamble) that Redis loads one key per 100 ms once told to
        -- (key-load-delay), answering clients between keys: loading lasts until the spec ends it
        for n = 0, 9 do
            local fill = ("for i = %d, %d do local t = {} for j = 1, 1100 do t[j] = string.char(math.random(0, 255)) "
                .. "end redis.call('SET', 'filler:' .. i, table.concat(t)) end return 1"):format(n * 100 + 1, n * 100 + 100)
            assert.equal(":1", r:command("EVAL", fill, "0"))
        end
        r:command("BGREWRITEAOF")
        assert.truthy(H.wait_until(function()
            local info = text(r:command("INFO", "persistence"))
            return info:find("aof_rewrite_in_progress:0", 1, true) and info:find("aof_rewrite_scheduled:0", 1, true)
                and info:find("aof_last_bgrewrite_status:ok", 1, true)
                and info:find("aof_rewrites:1", 1, true)
        end, 30), "the AOF rewrite did not end:\n" .. text(r:command("INFO", "persistence")))
        settle_survives(env, "LOADING", function()
            r:terminate(3) -- its dir (the AOF, with the claim's lock) stays
            r.args[#r.args + 1] = "--key-load-delay"
            r.args[#r.args + 1] = "100000"
            r.args[#r.args + 1] = "--loading-process-events-interval-bytes"
            r.args[#r.args + 1] = "1024"
            r:restart()
            assert.truthy(H.wait_until(function()
                return text(r:command("GET", "x")):find("^%-LOADING") ~= nil
            end, 20), "Redis is not loading")
        end, function()
            assert.equal("+OK", r:command("CONFIG", "SET", "key-load-delay", "0"))
        end)
    end)
end)

describe("a settle whose errors outlast its lock", function()
    it("is lost: logged at error with the key's digest, and counted in /metrics", function()
        -- the gateway's user may not run GETRANGE: claims (GET, SET) go, settles get an error reply; the lock
        -- lives 4 s, its refresh would come at 2 s, the answer at once
        local env = start({}, { lock_ttl = "4s", deadline = "4s", auth = "gw:secret@",
            before_gateway = function(redis)
                assert.equal("+OK", redis:command("ACL", "SETUSER", "gw", "on", ">secret", "~*", "+@all"))
            end })
        finally(env.stop)
        local gw, up, r = env.gw, env.up, env.redis
        assert.truthy(wait_ready(env), ctx(gw, "the gateway never connected to Redis"))
        assert.equal(0, lost(gw), ctx(gw))
        local before = {}
        for _, k in ipairs(r:command("KEYS", "ricochet:idem:*")) do before[k] = true end
        assert.equal("+OK", r:command("ACL", "SETUSER", "gw", "-getrange"))
        up:program({ default = { status = 201, body = '{"charged":"late"}' } })
        local key = I.new_key("lapse")
        local first = assert(I.post(gw.port, "/pay", key, '{"amount":7}'))
        assert.equal(201, first.status, ctx(gw))
        -- the record key the claim wrote: its digest is what the log must name
        local digest
        for _, k in ipairs(r:command("KEYS", "ricochet:idem:*")) do
            if not before[k] then digest = k:match("^ricochet:idem:(%x+)$") end
        end
        assert.truthy(digest, ctx(gw, "the claim's lock is not in Redis"))
        assert.equal(64, #digest)
        local line = H.wait_until(function()
            for l in error_log(gw):gmatch("[^\n]+") do
                if l:find(digest, 1, true) and l:find("lost", 1, true) then return l end
            end
        end, 30)
        assert.truthy(line, ctx(gw, "no lost settle logged for " .. digest))
        assert.truthy(line:find("[error]", 1, true), line)
        assert.truthy(line:find("answer of key digest " .. digest, 1, true), line)
        assert.truthy(H.wait_until(function() return lost(gw) == 1 end, 10), ctx(gw, "lost: " .. tostring(lost(gw))))
        -- it still goes when Redis takes it, for the key nobody claimed since: the repeat is replayed
        assert.equal("+OK", r:command("ACL", "SETUSER", "gw", "+getrange"))
        assert.truthy(wait_taken(r))
        assert.truthy(H.wait_until(function()
            return error_log(gw):find("Redis answers again", 1, true)
        end, 30), ctx(gw, "the settle never went"))
        local again = repeat_until_done(env, key, '{"amount":7}')
        assert.truthy(again, ctx(gw))
        assert.equal(201, again.status, ctx(gw, again.body))
        assert.equal("true", again.headers["idempotent-replayed"], ctx(gw))
        assert.equal(1, #up:hits({ bodies = false }), ctx(gw))
        assert.equal(1, lost(gw), ctx(gw))
    end)
end)
