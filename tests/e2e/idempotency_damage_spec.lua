-- A damaged LMDB idempotency store, end to end: a real store file is made by the real gateway (keyed POSTs to
-- the fault upstream), the gateway is stopped, and the file is damaged from Lua the way a disk, a copy or an
-- operator might damage it. Then what an operator sees: `ricochet -t`, `ricochet plan` and a start refuse it with
-- the idempotency_store line's FILE:LINE and what to do, or, with idempotency_store_recover rename, a start moves
-- it aside, says so in the error log and serves with an empty store.
-- And while a gateway runs: a record damaged under its workers is a store error (503) for its key alone, and a
-- client that leaves mid-upload of a streamed keyed body does not keep its key locked.
package.path = "tests/e2e/?.lua;" .. package.path
local H = require("helpers")
local lfs = require("lfs")

local ctx = H.context

local I = require("idem_helpers")
local function new_key() return I.new_key("dmg") end

-- A keyed POST to /pay (or path), and its repeat that waits out a key still in flight.
local function post(port, key, body, path) return I.post(port, path or "/pay", key, body) end
local function repeat_post(port, key, body, path) return I.repeat_post(port, path or "/pay", key, body) end

-- Line 10 is the idempotency_store directive: the errors name it. {{RECOVER}} is on line 4 (http level),
-- {{SERVER_RECOVER}} on line 9 (server level).
local CONF = [[
worker_processes 2;
error_log logs/error.log info;
http {
    {{RECOVER}}
    access_log logs/access.log;
    upstream up { server {{UPSTREAM}}; retry_budget off; }
    server {
        listen 127.0.0.1:{{PORT}};
        {{SERVER_RECOVER}}
        idempotency_store lmdb:{{STORE}} size=4m;
        location / { proxy_pass http://up; }
    }
}
]]
local STORE_LINE = 10
local RECOVER = "idempotency_store_recover rename;"

-- A gateway whose store is damaged, or whose clients misbehave, while it runs. The server has a name: it is
-- part of every record key (the server's first name, NUL, the location's path, NUL, "~" for a prefix
-- location, then the key, then the scope, which is empty without an Authorization field).
local LIVE_CONF = [[
worker_processes 2;
error_log logs/error.log info;
http {
    access_log logs/access.log;
    upstream up { server {{UPSTREAM}}; retry_budget off; }
    server {
        listen 127.0.0.1:{{PORT}};
        server_name gw;
        idempotency_store lmdb:{{STORE}} size=4m;
        location / { proxy_pass http://up; }
        location /upload/ { retry_body_max 1k; client_body_timeout 5s; proxy_pass http://up; }
    }
}
]]

local problem_type = I.problem_type

-- SHA-256 of bytes (they may hold NULs), by `openssl dgst`, as 32 raw bytes.
local function sha256(bytes, scratch)
    H.write_file(scratch, bytes)
    local f = assert(io.popen("openssl dgst -sha256 -binary " .. H.shell_quote(scratch) .. " 2>/dev/null", "r"))
    local out = f:read("*a")
    f:close()
    os.remove(scratch)
    assert(out and #out == 32, "openssl dgst gave " .. #(out or "") .. " bytes")
    return out
end

-- Every 0-based offset at which needle occurs in haystack.
local function offsets_of(haystack, needle)
    local out, from = {}, 1
    for _ = 1, 10000 do
        local at = haystack:find(needle, from, true)
        if not at then break end
        out[#out + 1] = at - 1
        from = at + 1
    end
    return out
end

-- The access log's entries (decoded) for a path.
local access_entries = H.access_entries

local function render(vars)
    return (CONF:gsub("{{([%w_]+)}}", function(name)
        return assert(vars[name], "no value for {{" .. name .. "}}")
    end))
end

-- Runs the binary (H.run: bounded, output with stderr); a sanitizer report in its output fails the spec.
local function run(argv)
    local code, out = H.run(argv, { timeout = 60 })
    local report = out:match("[^\n]*Sanitizer[^\n]*") or out:match("[^\n]*runtime error:[^\n]*")
    if report then error("the gateway reported a sanitizer error: " .. report .. "\n" .. out:sub(1, 4000), 2) end
    return code, out
end

local function dir_entries(dir)
    local out = {}
    for name in lfs.dir(dir) do
        if name ~= "." and name ~= ".." then out[#out + 1] = name end
    end
    table.sort(out)
    return out
end

local function file_size(path)
    return lfs.attributes(path, "size")
end

local function exists(path)
    return lfs.attributes(path, "mode") ~= nil
end

-- Writes bytes at an offset of an existing file, in place.
local function overwrite(path, offset, bytes)
    local f = assert(io.open(path, "r+b"))
    assert(f:seek("set", offset))
    assert(f:write(bytes))
    f:close()
end

-- Truncates an existing file to n bytes (LuaJIT has no ftruncate: the first n bytes are written back).
local function truncate(path, n)
    local f = assert(io.open(path, "rb"))
    local head = f:read(n) or ""
    f:close()
    H.write_file(path, head)
    assert(file_size(path) == n, "truncate " .. path)
end

local function random_bytes(n, seed)
    math.randomseed(seed)
    local out = {}
    for i = 1, n do out[i] = string.char(math.random(0, 255)) end
    return table.concat(out)
end

describe("a damaged LMDB idempotency store", function()
    local up, dir, store, conf_path
    local gws = {}

    -- `ricochet -t` and `ricochet plan` on a config naming the store (written to dir/ricochet.conf).
    local function write_conf(opts)
        opts = opts or {}
        H.write_file(conf_path, render({
            RECOVER = opts.recover and RECOVER or "",
            SERVER_RECOVER = opts.server_recover and RECOVER or "",
            UPSTREAM = up.addr, PORT = 1, STORE = store,
        }))
    end

    local function test_conf(opts)
        write_conf(opts)
        return run({ H.bin(), "-t", "-p", dir, "-c", conf_path })
    end

    local function plan_conf(opts)
        write_conf(opts)
        return run({ H.bin(), "plan", "-p", dir, "-c", conf_path })
    end

    local function start(opts)
        opts = opts or {}
        local gw = H.start_gateway({
            conf = CONF, upstream = up, wait = opts.wait,
            vars = { STORE = store, RECOVER = opts.recover and RECOVER or "", SERVER_RECOVER = "" },
        })
        gws[#gws + 1] = gw
        return gw
    end

    -- A real store: n keyed POSTs (bodies {"n":i}) through a real gateway, which is then stopped gracefully.
    -- Returns the keys (and the stopped gateway, whose log is kept).
    local function fill(n, body)
        up:program({ default = { status = 201, headers = { ["Content-Type"] = "application/json" },
            body = body or '{"stored":"answer"}' } })
        local gw = start()
        local keys = {}
        for i = 1, n do
            keys[i] = new_key()
            local r = assert(post(gw.port, keys[i], ('{"n":%d}'):format(i)))
            assert.equal(201, r.status, ctx(gw, "fill " .. i))
        end
        gw:stop()
        assert.is_nil(gw:log():find("exited on signal", 1, true), ctx(gw))
        assert.truthy(file_size(store) > 0)
        assert.truthy(exists(store .. "-lock"), "no lock file next to the store")
        up:reset()
        return keys, gw
    end

    -- The error every refusal shows: FILE:LINE of the idempotency_store line, the file, WHY, and what to do.
    local function assert_refused(out, why_pattern, file)
        local head = ("%s:%d: idempotency store \"lmdb:%s\" is damaged: "):format(file or conf_path, STORE_LINE, store)
        local at = out:find(head, 1, true)
        assert.truthy(at, "no \"" .. head .. "\" in:\n" .. out)
        local rest = out:sub(at + #head)
        assert.truthy(rest:match("^[^\n]*" .. why_pattern), "reason not " .. why_pattern .. " in:\n" .. out)
        assert.truthy(rest:find(("; move it aside (mv %s %s.damaged) to start with an empty store, whose keys can "
            .. "all run again, or set \"idempotency_store_recover rename\" to have that done at start"):format(
            store, store), 1, true), out)
    end

    -- `ricochet -t` and `ricochet plan` both refuse the file; returns -t's output.
    local function assert_check_fails(why_pattern)
        local code, out = test_conf()
        assert.equal(1, code, out)
        assert_refused(out, why_pattern)
        assert.truthy(out:find("test failed", 1, true), out)
        local pcode, pout = plan_conf()
        assert.equal(1, pcode, pout)
        assert_refused(pout, why_pattern)
        return out
    end

    local function assert_check_passes()
        local code, out = test_conf()
        assert.equal(0, code, out)
        assert.truthy(out:find("test is successful", 1, true), out)
        assert.is_nil(out:find("damaged", 1, true), out)
        local pcode, pout = plan_conf()
        assert.equal(0, pcode, pout)
        return out
    end

    -- A start (foreground) on the damaged file exits non-zero with the error on stderr, before any worker.
    local function assert_start_fails(why_pattern)
        local gw = start({ wait = false })
        local code = gw:wait_exit(30)
        local stderr = H.read_file(gw.prefix .. "/stderr.log") or ""
        local log = gw:log()
        gw:stop()
        assert.truthy(code, "the gateway did not exit: " .. log)
        assert.is_not.equal(0, code, log)
        assert_refused(stderr, why_pattern, gw.conf_path)
        assert.is_nil(log:find("started worker process", 1, true), log)
        assert.is_nil(log:find("started: master", 1, true), log)
    end

    -- The moved-aside files in dir.
    local function aside_files()
        local out = {}
        for _, name in ipairs(dir_entries(dir)) do
            if name:find("^s%.mdb%.damaged%-%d%d%d%d%d%d%d%dT%d%d%d%d%d%d$") then out[#out + 1] = name end
        end
        return out
    end

    -- Started with idempotency_store_recover rename on a damaged file: it is moved aside (logged), and a keyed
    -- POST runs once and is replayed, from a fresh store.
    local function assert_recovers(damaged_size)
        assert.same({}, aside_files())
        local gw = start({ recover = true })
        local aside = aside_files()
        assert.equal(1, #aside, ctx(gw, table.concat(dir_entries(dir), " ")))
        local aside_path = dir .. "/" .. aside[1]
        if damaged_size then assert.equal(damaged_size, file_size(aside_path)) end
        local log = H.read_file(gw.prefix .. "/logs/error.log") or ""
        local alert = log:match("[^\n]*%[alert%][^\n]*")
        assert.truthy(alert, ctx(gw))
        assert.truthy(alert:find(('idempotency store "lmdb:%s" is damaged ('):format(store), 1, true), alert)
        assert.truthy(alert:find("moved aside to " .. aside_path .. ", starting with an empty store", 1, true), alert)
        up:program({ default = { status = 201, body = "after recovery" } })
        local key = new_key()
        local first = assert(post(gw.port, key))
        assert.equal(201, first.status, ctx(gw))
        assert.is_nil(first.headers["idempotent-replayed"])
        local again = assert(repeat_post(gw.port, key))
        assert.equal(201, again.status, ctx(gw))
        assert.equal("after recovery", again.body)
        assert.equal("true", again.headers["idempotent-replayed"], ctx(gw))
        assert.equal(1, #up:hits())
        gw:stop()
        assert.is_nil(gw:log():find("exited on signal", 1, true), ctx(gw))
        -- the new file is a sound store of its own
        assert.truthy(exists(store))
        assert_check_passes()
        return aside_path
    end

    setup(function()
        up = H.start_upstream()
    end)

    teardown(function()
        if up then up:stop() end
    end)

    before_each(function()
        up:reset()
        dir = H.mkdtemp("idemdmg")
        store = dir .. "/s.mdb"
        conf_path = dir .. "/ricochet.conf"
        gws = {}
    end)

    after_each(function()
        for _, gw in ipairs(gws) do pcall(gw.stop, gw) end
        if dir then os.execute("rm -rf " .. H.shell_quote(dir)) end
    end)

    it("refuses 64 KiB of random bytes inside the data pages; recover rename moves the file aside", function()
        fill(200)
        assert_check_passes()
        local size = file_size(store)
        assert.truthy(size >= 16384 + 65536, "store of " .. size .. " bytes")
        overwrite(store, 16384, random_bytes(65536, 20240601))
        assert.equal(size, file_size(store))
        assert_check_fails("%S")
        assert_start_fails("%S")
        assert.truthy(exists(store))
        assert.same({}, aside_files())
        -- -t with recover rename passes, and says what a start will do (and does nothing yet)
        local code, out = test_conf({ recover = true })
        assert.equal(0, code, out)
        local warn = out:match("[^\n]*%[warn%][^\n]*")
        assert.truthy(warn, out)
        assert.truthy(warn:find(('idempotency store "lmdb:%s" is damaged ('):format(store), 1, true), warn)
        assert.truthy(warn:find("at start it is moved aside to " .. store .. ".damaged-", 1, true), warn)
        assert.truthy(warn:match("moved aside to [^ ]*%.damaged%-%d%d%d%d%d%d%d%dT%d%d%d%d%d%d"), warn)
        assert.same({}, aside_files())
        assert.equal(size, file_size(store))
        assert_recovers(size)
    end)

    it("refuses a file truncated to 8 KiB: its pages reach past its end", function()
        fill(200)
        truncate(store, 8192)
        assert_check_fails("truncated")
        assert_start_fails("truncated")
        assert_recovers(8192)
    end)

    it("refuses an emptied file next to its lock file; an empty file alone is a new store", function()
        fill(200)
        truncate(store, 0)
        assert.truthy(exists(store .. "-lock"))
        local out = assert_check_fails("it is empty, though its lock file " .. store:gsub("%p", "%%%0")
            .. "%-lock shows it was in use: was it truncated%?")
        assert.truthy(out:find("empty", 1, true), out)
        assert_start_fails("empty")
        os.remove(store .. "-lock")
        assert.equal(0, file_size(store))
        assert_check_passes()
        -- and a gateway makes it its store
        local gw = start()
        up:program({ default = { status = 201, body = "new store" } })
        local key = new_key()
        assert.equal(201, assert(post(gw.port, key)).status, ctx(gw))
        assert.equal("true", assert(repeat_post(gw.port, key)).headers["idempotent-replayed"], ctx(gw))
        assert.equal(1, #up:hits())
        gw:stop()
        assert.same({}, aside_files())
    end)

    it("refuses a record whose status was changed: it fails its checksum", function()
        fill(50)
        -- one answer with a body found nowhere else, stored last
        local marker = "MARKER-" .. H.text_body(24, 777):gsub("%W", "x")
        up:program({ default = { status = 201, body = marker } })
        local gw = start()
        local key = new_key()
        assert.equal(marker, assert(post(gw.port, key)).body)
        assert.equal("true", assert(repeat_post(gw.port, key)).headers["idempotent-replayed"], ctx(gw))
        gw:stop()
        up:reset()
        -- its record: 'd', expiry, fingerprint, token, lapse, boot, client, checksum (113 bytes), then the status
        -- (2 bytes, big-endian), the fields' length (4 bytes), the fields, and the body. The status of every copy
        -- of it becomes 0.
        local bytes = assert(H.read_file(store))
        local damaged, from = 0, 1
        for _ = 1, 100 do
            local at = bytes:find(marker, from, true)
            if not at then break end
            from = at + 1
            local body_off = at - 1 -- 0-based
            for s = body_off - 119, math.max(0, body_off - 119 - 4096), -1 do
                local b = bytes:byte(s + 1)
                if b == 100 then -- 'd'
                    local st_hi, st_lo = bytes:byte(s + 114), bytes:byte(s + 115)
                    local f1, f2, f3, f4 = bytes:byte(s + 116, s + 119)
                    local flen = ((f1 * 256 + f2) * 256 + f3) * 256 + f4
                    if st_hi * 256 + st_lo == 201 and s + 119 + flen == body_off then
                        overwrite(store, s + 113, "\0\0")
                        damaged = damaged + 1
                        break
                    end
                end
            end
        end
        assert.truthy(damaged >= 1, "the marker's record was not found in the file")
        assert_check_fails("record %d+ %(key digest %x+, a value of %d+ bytes%) fails its checksum")
        assert_start_fails("fails its checksum")
        assert_recovers()
    end)

    -- -t on a damaged file either refuses it ("is damaged", FILE:LINE) or passes it; a gateway started on it
    -- with recover rename then answers 20 keyed POSTs (and their repeats) without a worker dying.
    local function assert_no_crash()
        local code, out = test_conf()
        if code ~= 0 then
            assert.equal(1, code, out)
            assert_refused(out, "%S")
        else
            assert.truthy(out:find("test is successful", 1, true), out)
        end
        local gw = start({ recover = true })
        up:program({ default = { status = 201, body = "answered" } })
        local problems = {}
        for i = 1, 20 do
            local key, body = new_key(), ('{"i":%d}'):format(i)
            local r, err = post(gw.port, key, body)
            if not r then
                problems[#problems + 1] = ("request %d: no answer (%s)"):format(i, tostring(err))
            elseif not ((r.status >= 200 and r.status < 300) or r.status == 409 or r.status == 422
                or r.status == 503) then
                problems[#problems + 1] = ("request %d: status %d"):format(i, r.status)
            else
                local again, aerr = repeat_post(gw.port, key, body)
                if not again then
                    problems[#problems + 1] = ("repeat %d: no answer (%s)"):format(i, tostring(aerr))
                end
            end
        end
        local alive = #gw:workers()
        gw:stop()
        local log = gw:log()
        local crash = log:match("[^\n]*exited on signal[^\n]*") or log:match("[^\n]*exited with code[^\n]*")
        assert.is_nil(crash, ctx(gw, table.concat(problems, "\n")))
        assert.is_nil(log:find("signal 11", 1, true), log)
        assert.same({}, problems, ctx(gw))
        assert.equal(2, alive, ctx(gw))
    end

    it("never crashes a worker over whole pages of random bytes, whether the check finds them or not", function()
        fill(200)
        local size = file_size(store)
        local psize = 4096
        assert.truthy(size >= 12 * psize, "store of " .. size .. " bytes")
        overwrite(store, 3 * psize, random_bytes(6 * psize, 4242))
        assert_no_crash()
    end)

    -- The newer of the two meta pages (pages 0 and 1: a 16-byte page head, then magic, version, address,
    -- map size, the free and the main database (48 bytes each, the root page number at +40), the last page
    -- number and the transaction id) names the main database's root page.
    local function u64(bytes, off)
        local v = 0
        for i = 7, 0, -1 do v = v * 256 + bytes:byte(off + i + 1) end
        return v
    end

    local function main_root(bytes)
        local best, root
        for m = 0, 1 do
            local meta = m * 4096 + 16
            assert.equal(0xBEEFC0DE, u64(bytes, meta) % 2 ^ 32, "meta page " .. m)
            local txnid = u64(bytes, meta + 128)
            if not best or txnid > best then best, root = txnid, u64(bytes, meta + 112) end
        end
        return root, best
    end

    it("never crashes a worker over a page whose head names another page", function()
        fill(200)
        local bytes = assert(H.read_file(store))
        local root, txnid = main_root(bytes)
        assert.truthy(txnid >= 2 and root >= 2 and (root + 1) * 4096 <= #bytes, ("root %s, txn %s"):format(root, txnid))
        assert.equal(root, u64(bytes, root * 4096)) -- a page's head starts with its own number
        -- one byte: the top byte of the root page's own page number
        overwrite(store, root * 4096 + 6, "\108")
        assert_no_crash()
    end)

    it("passes a sound file, and a restart on it still replays a key stored before", function()
        local keys = fill(200)
        assert_check_passes()
        local _, pout = plan_conf()
        assert.truthy(pout:find("idempotency: keyed POST/PATCH deduped in lmdb:" .. store, 1, true), pout)
        up:program({ default = { status = 201, body = "before restart" } })
        local gw = start()
        local key = new_key()
        assert.equal("before restart", assert(post(gw.port, key)).body)
        assert.equal(1, #up:hits())
        gw:stop()
        assert_check_passes()
        local gw2 = start()
        local r = assert(repeat_post(gw2.port, key))
        assert.equal(201, r.status, ctx(gw2))
        assert.equal("before restart", r.body)
        assert.equal("true", r.headers["idempotent-replayed"], ctx(gw2))
        -- and one of the 200 from the first run, with its own body
        local old = assert(repeat_post(gw2.port, keys[100], '{"n":100}'))
        assert.equal(201, old.status, ctx(gw2))
        assert.equal('{"stored":"answer"}', old.body)
        assert.equal("true", old.headers["idempotent-replayed"])
        assert.equal(1, #up:hits())
        gw2:stop()
        assert.same({}, aside_files())
        assert.is_nil(gw2:log():find("[alert]", 1, true), gw2:log())
    end)

    it("takes idempotency_store_recover at the http level only", function()
        local code, out = test_conf({ server_recover = true })
        assert.equal(1, code, out)
        assert.truthy(out:find(conf_path .. ":9", 1, true), out)
        assert.truthy(out:find("\"idempotency_store_recover\" directive is not allowed here", 1, true), out)
        local ok, okout = test_conf({ recover = true })
        assert.equal(0, ok, okout) -- no file yet: nothing to recover, nothing said
        assert.is_nil(okout:find("damaged", 1, true), okout)
    end)

    local function start_live()
        local gw = H.start_gateway({ conf = LIVE_CONF, upstream = up, vars = { STORE = store } })
        gws[#gws + 1] = gw
        return gw
    end

    -- No worker died: none exited on a signal or with a code (the master logs either).
    local function assert_no_worker_died(gw, extra)
        local log = gw:log()
        local died = log:match("[^\n]*exited on signal[^\n]*") or log:match("[^\n]*exited with code[^\n]*")
        assert.is_nil(died, ctx(gw, extra))
    end

    it("a record damaged while the gateway runs is a store error for its key, never a crash", function()
        up:program({ default = { status = 201, headers = { ["Content-Type"] = "application/json" },
            body = '{"id":"d7"}' } })
        local gw = start_live()
        local first = assert(post(gw.port, "k7", '{"n":7}', "/d/7"))
        assert.equal(201, first.status, ctx(gw))
        assert.is_nil(first.headers["idempotent-replayed"])
        local again = assert(repeat_post(gw.port, "k7", '{"n":7}', "/d/7"))
        assert.equal(201, again.status, ctx(gw))
        assert.equal('{"id":"d7"}', again.body)
        assert.equal("true", again.headers["idempotent-replayed"], ctx(gw))
        assert.equal(1, #up:hits())
        -- k7's record key: server name, NUL, location path, NUL, "~" (a prefix location), the key; no scope
        local rkey = sha256("gw\0/\0~k7", dir .. "/k7.digest-input")
        local bytes = assert(H.read_file(store))
        local at = offsets_of(bytes, rkey)
        assert.truthy(#at >= 1, "k7's record key is nowhere in " .. store)
        -- each copy of its leaf node (the map is shared with the workers: they see this at once): the node's
        -- head is the 8 bytes before the key, the value's size (two little-endian uint16, lo then hi), the
        -- flags and the key's size. The value's size becomes 0x7ffffff0.
        for _, o in ipairs(at) do
            assert.truthy(o >= 8, "key at " .. o)
            local ksize = bytes:byte(o - 1) + 256 * bytes:byte(o)
            assert.equal(32, ksize, ("the node at %d names a key of %d bytes"):format(o - 8, ksize))
            overwrite(store, o - 8, "\240\255\255\127")
        end
        -- its key is now a store error (idempotency_store_failure closed): 503, on either worker, every time
        for i = 1, 4 do
            local r, err = post(gw.port, "k7", '{"n":7}', "/d/7")
            assert.truthy(r, ctx(gw, ("repeat %d after the damage: no answer (%s)"):format(i, tostring(err))))
            assert.equal(503, r.status, ctx(gw, ("repeat %d: %s"):format(i, r.body)))
            assert.equal("application/problem+json", r.headers["content-type"], ctx(gw))
            assert.equal("urn:ricochet:problem:idempotency-store-unavailable", problem_type(r), ctx(gw, r.body))
        end
        assert.equal(1, #up:hits())
        assert_no_worker_died(gw)
        -- and another key is served as ever: run once, then replayed
        up:program({ default = { status = 201, body = "k8 done" } })
        local k8 = assert(post(gw.port, "k8", '{"n":8}', "/d/8"))
        assert.equal(201, k8.status, ctx(gw, k8.body))
        assert.equal("k8 done", k8.body)
        local k8again = assert(repeat_post(gw.port, "k8", '{"n":8}', "/d/8"))
        assert.equal(201, k8again.status, ctx(gw, k8again.body))
        assert.equal("k8 done", k8again.body)
        assert.equal("true", k8again.headers["idempotent-replayed"], ctx(gw))
        assert.equal(2, #up:hits())
        local alive = #gw:workers()
        gw:stop() -- under ASan: fails on any sanitizer report
        assert_no_worker_died(gw)
        assert.equal(2, alive, ctx(gw))
    end)

    it("a client that leaves mid-upload of a streamed keyed body releases its key", function()
        up:program({ default = { status = 201, body = "uploaded", delay_ms = 200 } })
        local gw = start_live()
        local path, body = "/upload/b1", H.text_body(5000, 5000)
        -- more than retry_body_max (1k): streamed to the upstream as it comes; the client sends half and leaves
        local c = assert(H.connect(gw.port))
        assert(c:send(("POST %s HTTP/1.1\r\nHost: 127.0.0.1:%d\r\nIdempotency-Key: kb1\r\n"
            .. "Content-Type: application/json\r\nContent-Length: 5000\r\n\r\n"):format(path, gw.port)))
        assert(c:send(body:sub(1, 2500)))
        H.sleep(0.3)
        c:close()
        -- the key is free again: the whole request runs (not 409 idempotency-key-in-use until its lock lapses)
        local seen = {}
        local done = H.wait_until(function()
            local r, err = post(gw.port, "kb1", body, path)
            seen[#seen + 1] = r and (r.status .. (problem_type(r) and (" " .. problem_type(r)) or "")) or tostring(err)
            if r and r.status == 201 then return r end
            H.sleep(0.1)
        end, 20)
        assert.truthy(done, ctx(gw, "answers to the full request: " .. table.concat(seen, ", ")))
        assert.equal("uploaded", done.body)
        assert.is_nil(done.headers["idempotent-replayed"])
        local whole = 0
        for _, hit in ipairs(up:hits()) do
            if H.hit_values(hit, "Idempotency-Key")[1] == "kb1" and hit.body == body and not hit.incomplete then
                whole = whole + 1
            end
        end
        assert.equal(1, whole, ctx(gw, "upstream hits: " .. H.json.encode(up:hits({ bodies = false }))))
        -- the first request's access log line: released
        local first
        H.wait_until(function()
            for _, e in ipairs(access_entries(gw, path)) do
                if e.status ~= 201 and e.status ~= 409 then first = e end
            end
            return first
        end, 15)
        local log = H.read_file(gw.prefix .. "/logs/access.log") or ""
        assert.truthy(first, ctx(gw, "no line for the first request in:\n" .. log))
        assert.equal("released", first.idempotency, ctx(gw, log))
        assert.equal(2, #gw:workers(), ctx(gw))
        gw:stop()
        assert_no_worker_died(gw)
    end)
end)
