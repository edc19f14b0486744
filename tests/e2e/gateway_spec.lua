-- The real binary end to end: start-up, -t, signals, workers, keep-alive, timeouts, malformed requests.
package.path = "tests/e2e/?.lua;" .. package.path
local H = require("helpers")
local socket = require("socket")

local BASIC = [[
worker_processes 1;
error_log logs/error.log info;
pid logs/ricochet.pid;
http {
    server {
        listen 127.0.0.1:{{PORT}};
        location / {}
    }
}
]]

local function start(conf, opts)
    opts = opts or {}
    opts.conf = conf or BASIC
    return H.start_gateway(opts)
end

local function status_of(raw)
    return tonumber((raw or ""):match("^HTTP/1%.1 (%d%d%d)"))
end

local function count(s, pat)
    local n = 0
    for _ in s:gmatch(pat) do n = n + 1 end
    return n
end

describe("ricochet -t", function()
    local dir

    before_each(function()
        dir = H.mkdtemp("conf")
    end)

    after_each(function()
        os.execute("rm -rf " .. H.shell_quote(dir))
    end)

    it("accepts the shipped configuration", function()
        local code, out = H.run({ H.bin(), "-t", "-c", H.root .. "/conf/ricochet.conf" })
        assert.equal(0, code)
        assert.matches("configuration file .*/conf/ricochet.conf test is successful", out)
    end)

    it("refuses a bad file with FILE:LINE: reason and exit status 1", function()
        H.write_file(dir .. "/bad.conf", "worker_processes 1;\nhttp {\n    server {\n        lisen 80;\n    }\n}\n")
        local code, out = H.run({ H.bin(), "-t", "-c", dir .. "/bad.conf" })
        assert.equal(1, code)
        assert.truthy(out:find(dir .. "/bad.conf:4: unknown directive \"lisen\"", 1, true), out)
        assert.matches("test failed", out)
    end)

    it("resolves a relative -c and include against -p", function()
        os.execute("mkdir -p " .. H.shell_quote(dir .. "/conf/sites"))
        H.write_file(dir .. "/conf/main.conf", "http { include conf/sites/*.conf; }\n")
        H.write_file(dir .. "/conf/sites/a.conf", "server { listen 127.0.0.1:1; }\n")
        H.write_file(dir .. "/conf/sites/b.conf", "server { listen 127.0.0.1:2;\n client_max_body_size 1q; }\n")
        local code, out = H.run({ H.bin(), "-t", "-p", dir, "-c", "conf/main.conf" })
        assert.equal(1, code)
        assert.truthy(out:find(dir .. "/conf/sites/b.conf:2: invalid value \"1q\"", 1, true), out)
    end)

    it("plan prints each route's waits and warns about retries that can never happen", function()
        H.write_file(dir .. "/plan.conf", [[
http {
    upstream u { server 127.0.0.1:1; }
    server {
        listen 127.0.0.1:1;
        location /a { proxy_pass http://u; retry_attempts 8; retry_backoff 2s 10s 2 jitter=none;
                      retry_timeout 20s; per_try_timeout 5s; }
        location /b { proxy_pass http://u; }
    }
}
]])
        local code, out = H.run({ H.bin(), "plan", "-c", dir .. "/plan.conf", "/a" })
        assert.equal(0, code, out)
        assert.matches("retry 1 %(attempt 2%): wait 2s, starts 2s to 7s", out)
        assert.matches("retry 3 %(attempt 4%): wait 8s", out)
        assert.matches("retry 4 %(attempt 5%): wait 10s, starts 24s to 44s after the request  %-%- can never happen", out)
        assert.matches("warning: 4 of the 7 retries can never happen within retry_timeout", out)
        assert.is_nil(out:find("location /b", 1, true))
        code, out = H.run({ H.bin(), "plan", "-c", dir .. "/plan.conf" })
        assert.equal(0, code)
        assert.matches("location /b %-> upstream u", out)
        assert.matches("wait %[0ms, 250ms%)", out)
    end)

    it("reads a config that starts with a UTF-8 byte order mark", function()
        H.write_file(dir .. "/bom.conf", "\239\187\191worker_processes 1;\n")
        local code, out = H.run({ H.bin(), "-t", "-c", dir .. "/bom.conf" })
        assert.equal(0, code, out)
    end)

    it("refuses a -p that is not a directory and an empty -c", function()
        local code, out = H.run({ H.bin(), "-t", "-p", dir .. "/nope" })
        assert.equal(1, code)
        assert.matches("is not a directory", out)
        code, out = H.run({ H.bin(), "-t", "-c", "" })
        assert.equal(1, code)
        assert.matches("%-c needs a file name", out)
    end)

    it("prints the version and the libraries it runs on", function()
        local code, out = H.run({ H.bin(), "-v" })
        assert.equal(0, code)
        assert.matches("ricochet version %d+%.%d+%.%d+", out)
        assert.matches("libevent 2%.", out)
        assert.matches("OpenSSL 3%.", out)
        assert.matches("LuaJIT 2%.1", out)
    end)

    it("lists every directive with its context and default", function()
        local code, out = H.run({ H.bin(), "--directives" })
        assert.equal(0, code)
        assert.matches("client_max_body_size\thttp,server,location\t1m\t", out)
        assert.matches("worker_processes\tmain\tauto\t", out)
    end)

    it("documents every directive in conf/REFERENCE.md with its default", function()
        local _, out = H.run({ H.bin(), "--directives" })
        local ref = H.read_file(H.root .. "/conf/REFERENCE.md")
        local n = 0
        for name, ctx, default in out:gmatch("([%w_]+)\t([%w,]+)\t([^\t]+)\t[^\n]*\n") do
            n = n + 1
            assert.truthy(ref:find("### `" .. name, 1, true), "REFERENCE.md lacks " .. name)
            if default ~= "-" and default ~= '""' then
                assert.truthy(ref:find("Default `" .. default .. "`", 1, true),
                    "REFERENCE.md lacks the default of " .. name .. " (" .. ctx .. "): " .. default)
            end
        end
        assert.is_true(n > 15)
    end)
end)

describe("the gateway process", function()
    it("answers 404 to a request that matches nothing, and writes then removes its pid file", function()
        local gw = start()
        local res = assert(H.request(gw.port, { path = "/nothing/here" }))
        assert.equal(404, res.status)
        assert.equal("ricochet", res.headers.server)
        assert.truthy(res.headers.date)
        local pid = tonumber(H.read_file(gw.prefix .. "/logs/ricochet.pid"))
        assert.equal(gw.pid, pid)
        gw:signal("TERM")
        assert.truthy(gw:wait_exit(5))
        assert.equal(0, gw.exit_code)
        assert.is_nil(H.read_file(gw.prefix .. "/logs/ricochet.pid"))
        gw:stop()
    end)

    it("starts worker_processes workers and replaces one that dies", function()
        local gw = start((BASIC:gsub("worker_processes 1", "worker_processes 2")))
        local workers = H.wait_until(function()
            local w = gw:workers()
            return #w == 2 and w
        end, 5)
        assert.truthy(workers, "expected two workers")
        local r = os.execute("kill -9 " .. workers[1])
        assert.is_true(r == 0 or r == true, "kill -9 failed")
        local replaced = H.wait_until(function()
            local w = gw:workers()
            if #w ~= 2 then return nil end
            for _, p in ipairs(w) do if p == workers[1] then return nil end end
            return w
        end, 5)
        assert.truthy(replaced, "the dead worker was not replaced")
        assert.equal(404, assert(H.request(gw.port, { path = "/" })).status)
        assert.matches("exited on signal 9", gw:log())
        gw:stop()
    end)

    it("stops gracefully on SIGQUIT: an in-flight request is answered, then it exits", function()
        local gw = start()
        local conn = assert(H.connect(gw.port))
        -- a first answer proves the worker holds the connection
        assert.equal(404, assert(conn:request({ path = "/first" })).status)
        assert(conn:send("GET /in-flight HTTP/1.1\r\nHost: a\r\n"))
        gw:signal("QUIT")
        H.sleep(0.3)
        assert.is_true(gw:alive(), "the master left before its request was answered")
        assert(conn:send("\r\n"))
        local res = assert(conn:read_response())
        assert.equal(404, res.status)
        assert.equal("close", res.headers.connection)
        assert.truthy(conn:closed(10))
        assert.truthy(gw:wait_exit(5), "the master did not exit after the last request")
        assert.equal(0, gw.exit_code)
        gw:stop()
    end)

    it("on SIGQUIT, answers a keep-alive connection's next request with close, and closes idle ones after a second", function()
        local gw = start()
        local busy, idle = assert(H.connect(gw.port)), assert(H.connect(gw.port))
        assert.equal(404, assert(busy:request({ path = "/" })).status)
        assert.equal(404, assert(idle:request({ path = "/" })).status)
        gw:signal("QUIT")
        assert.truthy(H.wait_until(function() return gw:log():find("gracefully shutting down") end, 10), gw:log())
        -- its last answer promised the connection: a request sent now is answered, and the connection closes
        local r = assert(busy:request({ path = "/again" }))
        assert.equal(404, r.status)
        assert.equal("close", (r.headers["connection"] or ""):lower())
        assert.truthy(busy:closed(10))
        assert.truthy(idle:closed(10))
        assert.truthy(gw:wait_exit(15))
        gw:stop()
    end)

    it("stops fast on SIGTERM and SIGINT, workers included", function()
        for _, sig in ipairs({ "TERM", "INT" }) do
            local gw = start()
            local workers = H.wait_until(function() return #gw:workers() == 1 and gw:workers() end, 5)
            gw:signal(sig)
            assert.truthy(gw:wait_exit(5))
            assert.truthy(H.wait_until(function() return not H.pid_alive(workers[1]) end, 5))
            gw:stop()
        end
    end)

    it("ricochet -s quit and -s stop find the master through its pid file", function()
        local gw = start()
        gw:wait_pid_file()
        local code = H.run({ H.bin(), "-p", gw.prefix, "-c", gw.conf_path, "-s", "stop" })
        assert.equal(0, code)
        assert.truthy(gw:wait_exit(15))
        gw:stop()
    end)

    it("reopens its log on SIGUSR1", function()
        local gw = start()
        -- a worker that answered has its signal handlers (the master's socket accepts before)
        assert.truthy(H.wait_until(function()
            return (H.raw(gw.port, "GET / HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n") or ""):find("^HTTP/1%.1")
        end, 10))
        os.rename(gw.prefix .. "/logs/error.log", gw.prefix .. "/logs/error.log.1")
        gw:signal("USR1")
        -- the worker says when it has its new file; only then is the next line sure to land there
        assert.truthy(H.wait_until(function()
            return (H.read_file(gw.prefix .. "/logs/error.log") or ""):find("worker reopened its log files")
        end, 10))
        H.raw(gw.port, "BAD\r\n\r\n")
        assert.truthy(H.wait_until(function()
            return (H.read_file(gw.prefix .. "/logs/error.log") or ""):find("invalid request")
        end, 10))
        gw:stop()
    end)

    it("reopens its access log on -s reopen after logrotate moved it", function()
        local gw = start((BASIC:gsub("http {", "http {\n    access_log logs/access.log;")))
        assert.truthy(H.wait_until(function()
            return (H.raw(gw.port, "GET /before HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n") or ""):find("^HTTP/1%.1")
        end, 10))
        local log = gw.prefix .. "/logs/access.log"
        assert.truthy(H.wait_until(function() return (H.read_file(log) or ""):find("/before", 1, true) end, 5))
        os.rename(log, log .. ".1")
        gw:wait_pid_file()
        local code, out = H.run({ H.bin(), "-p", gw.prefix, "-c", gw.conf_path, "-s", "reopen" })
        assert.equal(0, code, out)
        assert.truthy(H.wait_until(function()
            return (H.read_file(gw.prefix .. "/logs/error.log") or ""):find("worker reopened its log files")
        end, 10), gw:log())
        H.raw(gw.port, "GET /after HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n")
        assert.truthy(H.wait_until(function() return (H.read_file(log) or ""):find("/after", 1, true) end, 5), gw:log())
        assert.is_nil((H.read_file(log .. ".1") or ""):find("/after", 1, true))
        gw:stop()
    end)

    it("refuses to start when a listen address is taken, naming it", function()
        local gw = start()
        local gw2 = start(nil, { ports = { gw.port }, wait = false })
        assert.truthy(gw2:wait_exit(5))
        assert.equal(1, gw2.exit_code)
        assert.matches("bind%(%) to 127%.0%.0%.1:" .. gw.port .. " failed", gw2:log())
        gw2:stop()
        gw:stop()
    end)

    it("says on the terminal why it could not start, even with error_log in a file", function()
        local gw = start()
        local conf = BASIC:gsub("127%.0%.0%.1:{{PORT}}", "127.0.0.1:" .. gw.port)
        local gw2 = start(conf, { wait = false })
        assert.truthy(gw2:wait_exit(5))
        assert.equal(1, gw2.exit_code)
        local stderr = H.read_file(gw2.prefix .. "/stderr.log") or ""
        assert.matches("bind%(%) to 127%.0%.0%.1:" .. gw.port .. " failed", stderr)
        gw2:stop()
        gw:stop()
    end)

    it("refuses to start on a bad config, with FILE:LINE", function()
        local gw = start("http {\n  server {\n    listen 127.0.0.1:{{PORT}};\n    bogus on;\n  }\n}\n",
            { wait = false })
        assert.truthy(gw:wait_exit(5))
        assert.equal(1, gw.exit_code)
        assert.matches("ricochet%.conf:4: unknown directive \"bogus\"", gw:log())
        gw:stop()
    end)
end)

describe("client connections", function()
    local gw

    setup(function()
        gw = start([[
worker_processes 1;
error_log logs/error.log info;
http {
    # short enough to wait out in a spec, long enough that no exchange of these specs comes near them
    # on a busy machine
    client_header_timeout 3s;
    client_body_timeout 3s;
    keepalive_timeout 3s;
    server {
        listen 127.0.0.1:{{PORT}};
        location / {}
        location /small { client_max_body_size 10; }
        location /few { keepalive_requests 2; }
    }
}
]])
    end)

    teardown(function()
        gw:stop()
    end)

    it("keeps an HTTP/1.1 connection open for several requests", function()
        local conn = assert(H.connect(gw.port))
        for i = 1, 3 do
            local res = assert(conn:request({ path = "/r" .. i }))
            assert.equal(404, res.status)
            assert.is_nil(res.headers.connection)
        end
        conn:close()
    end)

    it("closes after Connection: close and after an HTTP/1.0 request", function()
        local out, closed = H.raw(gw.port, "GET / HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n")
        assert.equal(404, status_of(out))
        assert.matches("Connection: close", out)
        assert.is_true(closed)
        out, closed = H.raw(gw.port, "GET / HTTP/1.0\r\n\r\n")
        assert.equal(404, status_of(out))
        assert.is_true(closed)
    end)

    it("keeps an HTTP/1.0 keep-alive connection open", function()
        local conn = assert(H.connect(gw.port))
        assert(conn:send("GET / HTTP/1.0\r\nConnection: keep-alive\r\n\r\n"))
        local res = assert(conn:read_response())
        assert.equal("keep-alive", res.headers.connection)
        assert(conn:send("GET / HTTP/1.0\r\n\r\n"))
        assert.equal(404, assert(conn:read_response()).status)
        assert.truthy(conn:closed(10))
    end)

    it("answers pipelined requests in order, bodies included", function()
        local reqs = "GET /a HTTP/1.1\r\nHost: a\r\n\r\n"
            .. "POST /b HTTP/1.1\r\nHost: a\r\nContent-Length: 5\r\n\r\nhello"
            .. "HEAD /c HTTP/1.1\r\nHost: a\r\n\r\n"
            .. "PUT /d HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n0\r\n\r\n"
            .. "GET /e HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n"
        local out, closed = H.raw(gw.port, reqs)
        local list = H.parse_responses(out, { methods = { "GET", "POST", "HEAD", "PUT", "GET" } })
        assert.equal(5, #list)
        for _, r in ipairs(list) do assert.equal(404, r.status) end
        assert.equal("", list[3].body) -- HEAD: no body
        assert.equal("14", list[3].headers["content-length"])
        assert.is_true(closed)
    end)

    it("serves a pipeline sent one byte at a time", function()
        local reqs = "GET /a HTTP/1.1\r\nHost: a\r\n\r\nGET /b HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n"
        local pieces = {}
        for i = 1, #reqs do pieces[i] = reqs:sub(i, i) end
        local out = H.raw(gw.port, reqs, { pieces = pieces })
        assert.equal(2, count(out, "HTTP/1%.1 404"))
    end)

    it("sends 100 Continue before reading a body the client holds back", function()
        local conn = assert(H.connect(gw.port))
        assert(conn:send("POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 4\r\nExpect: 100-continue\r\n\r\n"))
        local interim = conn.reader:head(socket.gettime() + 15, 65536)
        assert.equal("HTTP/1.1 100 Continue", interim)
        assert.equal("", conn.reader.buf, "more than the interim answer came before the body")
        assert(conn:send("body"))
        local res = assert(conn:read_response())
        assert.equal(404, res.status)
        assert.equal(0, #res.interim)
        conn:close()
    end)

    it("answers 413 at once, without 100 Continue, for a body over client_max_body_size", function()
        local out, closed = H.raw(gw.port,
            "POST /small HTTP/1.1\r\nHost: a\r\nContent-Length: 11\r\nExpect: 100-continue\r\n\r\n")
        assert.equal(413, status_of(out))
        assert.is_nil(out:find("100 Continue", 1, true))
        assert.is_true(closed)
        -- a chunked body is stopped once it grows past the limit
        out, closed = H.raw(gw.port, "POST /small HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n"
            .. "6\r\nabcdef\r\n6\r\nghijkl\r\n0\r\n\r\n")
        assert.equal(413, status_of(out))
        assert.is_true(closed)
        -- at the limit is fine
        local res = assert(H.request(gw.port, { method = "POST", path = "/small", body = "0123456789" }))
        assert.equal(404, res.status)
    end)

    it("closes after keepalive_requests requests", function()
        local conn = assert(H.connect(gw.port))
        assert.is_nil(assert(conn:request({ path = "/few" })).headers.connection)
        assert.equal("close", assert(conn:request({ path = "/few" })).headers.connection)
        assert.truthy(conn:closed(10))
    end)

    it("answers 408 when the head does not arrive within client_header_timeout", function()
        local out, closed = H.raw(gw.port, "GET / HTTP/1.1\r\nHost: a\r\n", { timeout = 15 })
        assert.equal(408, status_of(out))
        assert.is_true(closed)
    end)

    it("answers 408 when the body stalls past client_body_timeout", function()
        local out, closed = H.raw(gw.port, "POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 10\r\n\r\nabc",
            { timeout = 15 })
        assert.equal(408, status_of(out))
        assert.is_true(closed)
    end)

    it("closes an idle keep-alive connection after keepalive_timeout, without an answer", function()
        local conn = assert(H.connect(gw.port))
        assert.equal(404, assert(conn:request({ path = "/" })).status)
        local data, closed = conn:read_all(15)
        assert.is_true(closed)
        assert.equal("", data)
    end)

    it("keeps a slow but steady client that stays within the timeouts", function()
        local out = H.raw(gw.port, "GET / HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n",
            { pieces = 4, pause = 0.1 })
        assert.equal(404, status_of(out))
    end)
end)

-- Each malformed request gets its status, a closed connection, and the request
-- pipelined after it is never answered.
local MALFORMED = {
    { "both Content-Length and Transfer-Encoding", 400,
        "POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 3\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n" },
    { "differing Content-Lengths", 400, "POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 3\r\nContent-Length: 4\r\n\r\nabcd" },
    { "a signed Content-Length", 400, "POST / HTTP/1.1\r\nHost: a\r\nContent-Length: +3\r\n\r\nabc" },
    { "a hex Content-Length", 400, "POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 0x3\r\n\r\nabc" },
    { "a Content-Length with a space inside", 400, "POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 1 0\r\n\r\n" },
    { "an overflowing Content-Length", 400,
        "POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 99999999999999999999999\r\n\r\n" },
    { "an empty Content-Length", 400, "POST / HTTP/1.1\r\nHost: a\r\nContent-Length: \r\n\r\n" },
    { "Transfer-Encoding twice", 400,
        "POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n" },
    { "an empty Transfer-Encoding", 400, "POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: \r\n\r\n" },
    { "a final coding that is not chunked", 400, "POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked, gzip\r\n\r\n" },
    { "a coding we do not implement", 501, "POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: gzip, chunked\r\n\r\n0\r\n\r\n" },
    { "Transfer-Encoding in HTTP/1.0", 400, "POST / HTTP/1.0\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n" },
    { "a chunk size with a 0x prefix", 400, "POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n0x3\r\nabc\r\n0\r\n\r\n" },
    { "a signed chunk size", 400, "POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n+3\r\nabc\r\n0\r\n\r\n" },
    { "a chunk size with a space", 400, "POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n3 \r\nabc\r\n0\r\n\r\n" },
    { "an overlong chunk size", 400,
        "POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n10000000000000003\r\nabc\r\n0\r\n\r\n" },
    { "chunk data running past its size", 400, "POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabcdef\r\n0\r\n\r\n" },
    { "a bare CR in a chunk extension", 400,
        "POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n3;a=b\rc\r\nabc\r\n0\r\n\r\n" },
    { "obs-fold", 400, "GET / HTTP/1.1\r\nHost: a\r\nX-A: 1\r\n  2\r\n\r\n" },
    { "whitespace before a colon", 400, "GET / HTTP/1.1\r\nHost : a\r\n\r\n" },
    { "whitespace before the first field", 400, "GET / HTTP/1.1\r\n Host: a\r\n\r\n" },
    { "a CR inside a value", 400, "GET / HTTP/1.1\r\nHost: a\r\nX-A: b\rc\r\n\r\n" },
    { "a NUL inside a value", 400, "GET / HTTP/1.1\r\nHost: a\r\nX-A: b\0c\r\n\r\n" },
    { "a bare LF line ending", 400, "GET / HTTP/1.1\nHost: a\n\n" },
    { "a control character in a name", 400, "GET / HTTP/1.1\r\nHost: a\r\nX\1A: b\r\n\r\n" },
    { "a control character in the target", 400, "GET /a\1b HTTP/1.1\r\nHost: a\r\n\r\n" },
    { "an invalid method", 400, "GE(T / HTTP/1.1\r\nHost: a\r\n\r\n" },
    { "a lowercase version", 400, "GET / http/1.1\r\nHost: a\r\n\r\n" },
    { "HTTP/2.0 in a request line", 505, "GET / HTTP/2.0\r\nHost: a\r\n\r\n" },
    { "HTTP/1.1 without Host", 400, "GET / HTTP/1.1\r\nX-A: b\r\n\r\n" },
    { "two Hosts", 400, "GET / HTTP/1.1\r\nHost: a\r\nHost: b\r\n\r\n" },
    { "a request line over 8 KiB", 414, "GET /" .. ("a"):rep(8200) .. " HTTP/1.1\r\nHost: a\r\n\r\n" },
    { "a header section over 32 KiB", 431, "GET / HTTP/1.1\r\nHost: a\r\nX-Big: " .. ("b"):rep(33 * 1024) .. "\r\n\r\n" },
    { "more than 100 fields", 431, "GET / HTTP/1.1\r\nHost: a\r\n" .. ("X-F: 1\r\n"):rep(100) .. "\r\n" },
}

describe("malformed requests", function()
    local gw

    setup(function()
        gw = start()
    end)

    teardown(function()
        gw:stop()
    end)

    for _, case in ipairs(MALFORMED) do
        local name, status, bytes = case[1], case[2], case[3]
        it(("%s → %d, closed, nothing after it served"):format(name, status), function()
            local follow = "GET /after HTTP/1.1\r\nHost: a\r\n\r\n"
            local out, closed = H.raw(gw.port, bytes .. follow, { timeout = 5 })
            assert.equal(status, status_of(out), out)
            assert.matches("Connection: close", out)
            assert.equal(1, count(out, "HTTP/1%.1 %d%d%d"), "a request after a bad one was answered")
            assert.is_true(closed)
        end)
    end

    it("logs why a request was refused, with the client address", function()
        H.raw(gw.port, "GET / HTTP/1.1\r\nHost : a\r\n\r\n")
        assert.truthy(H.wait_until(function()
            return gw:log():find("client sent an invalid request %(400: [^)]+%) while reading the request, client: 127%.0%.0%.1:%d+")
        end, 3), gw:log())
    end)

    it("keeps serving other connections after bad ones", function()
        for _ = 1, 20 do H.raw(gw.port, "\0\1\2 garbage\r\n\r\n", { timeout = 2 }) end
        assert.equal(404, assert(H.request(gw.port, { path = "/" })).status)
    end)
end)
