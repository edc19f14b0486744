-- The request pipeline end to end: how a request ends (finalize, lingering close), what the head sent each way
-- carries (Date, hop-by-hop, $host, underscores) and what the access log says about retries not made.
package.path = "tests/e2e/?.lua;" .. package.path
local H = require("helpers")
local socket = require("socket")

local json = H.json

local ctx = H.context

local hit_values = H.hit_values

local access_lines = H.access_entries

-- Reads from conn until the peer closes (FIN: "closed", RST: "reset") or `seconds` pass.
local function read_to_close(conn, seconds)
    local deadline = socket.gettime() + (seconds or 10)
    local parts = {}
    for _ = 1, 1000000 do
        local data, err = conn.reader.fill(deadline)
        if not data then return table.concat(parts), err end
        parts[#parts + 1] = data
    end
    return table.concat(parts), "too much"
end

local CONF = [[
worker_processes 1;
error_log logs/error.log info;
http {
    access_log {{PREFIX}}/logs/access.log;
    retry_backoff 10ms 20ms;
    upstream backend {
        server {{UPSTREAM}};
        keepalive 8;
    }
    # no pooled connection: an attempt opens one, which the upstream counts
    upstream fresh {
        server {{UPSTREAM}};
        keepalive 0;
    }
    server {
        listen 127.0.0.1:{{PORT}};
        server_name a.test;
        keepalive_requests 2;
        location / {
            proxy_pass http://backend;
            proxy_set_header X-Server a;
        }
        location /wait/ {
            proxy_pass http://backend;
            retry_backoff 3s 3s 1 jitter=none adaptive=off;
        }
        location /two/ {
            proxy_pass http://backend;
            retry_attempts 2;
        }
        location /underscores/ {
            proxy_pass http://backend;
            underscores_in_headers on;
        }
        location /stream/ {
            proxy_pass http://fresh;
            retry_body_max 1k;
        }
    }
    server {
        listen 127.0.0.1:{{PORT}};
        server_name b.test;
        location / {
            proxy_pass http://backend;
            proxy_set_header Host $host;
            proxy_set_header X-Server b;
        }
    }
}
]]

describe("the request pipeline", function()
    local up, gw

    setup(function()
        up = H.start_upstream()
        gw = H.start_gateway({ conf = CONF, upstream = up })
    end)

    teardown(function()
        if gw then gw:stop() end
        if up then up:stop() end
    end)

    before_each(function()
        up:reset()
        up:program({ default = { status = 200, body = "ok" } })
    end)

    describe("a streamed upload that breaks", function()
        it("is logged as its attempt's class, client_body, and the client gets its 400", function()
            up:program({ default = { status = 200, body = "ok", delay_ms = 300 } })
            -- more than retry_body_max: streamed upstream as it comes; then a chunk size that is no number
            local before = up:stats().connections
            local c = assert(H.connect(gw.port))
            assert(c:send("POST /stream/x HTTP/1.1\r\nHost: a.test\r\nTransfer-Encoding: chunked\r\n\r\n"
                .. "800\r\n" .. ("x"):rep(2048) .. "\r\n"))
            -- the attempt is under way, its upload streaming: it has connected to the upstream
            assert.truthy(H.wait_until(function() return up:stats().connections > before end, 20),
                ctx(gw, "the attempt never connected"))
            assert(c:send("zz\r\n"))
            local resp = c:read_response({ timeout = 20 })
            c:close()
            assert.truthy(resp, ctx(gw))
            assert.equal(400, resp.status)
            local entry = H.wait_until(function()
                for _, e in ipairs(access_lines(gw)) do
                    if e.path == "/stream/x" then return e end
                end
            end, 5)
            assert.truthy(entry, ctx(gw))
            assert.equal(400, entry.status)
            assert.equal(1, #entry.attempts, json.encode(entry))
            assert.equal("client_body", entry.attempts[1].class)
        end)
    end)

    describe("command line", function()
        it("takes --help and --version like -h and -v, also for plan", function()
            local code, out = H.run({ H.bin(), "--help" }, { timeout = 10 })
            assert.equal(0, code, out)
            assert.matches("usage: ricochet", out)
            code, out = H.run({ H.bin(), "--version" }, { timeout = 10 })
            assert.equal(0, code, out)
            assert.matches("ricochet version %d", out)
            code, out = H.run({ H.bin(), "plan", "--help" }, { timeout = 10 })
            assert.equal(0, code, out)
            assert.matches("usage: ricochet plan", out)
        end)
    end)

    describe("the answer's head", function()
        it("carries a Date when the upstream sent none, and the upstream's own when it did", function()
            local resp = assert(H.request(gw.port, { path = "/x" }))
            assert.equal(200, resp.status)
            local dates = H.header_values(resp, "Date")
            assert.equal(1, #dates, ctx(gw))
            assert.matches("^%a%a%a, %d%d %a%a%a %d%d%d%d %d%d:%d%d:%d%d GMT$", dates[1])

            up:program({ default = { status = 200, body = "ok",
                headers = { { "Date", "Tue, 01 Dec 2026 00:00:00 GMT" } } } })
            resp = assert(H.request(gw.port, { path = "/x" }))
            assert.same({ "Tue, 01 Dec 2026 00:00:00 GMT" }, H.header_values(resp, "Date"))
        end)

        it("drops every field a Connection header names, however many, both ways", function()
            local names, req_headers, resp_headers = {}, {}, {}
            for i = 1, 20 do
                names[i] = "X-Hop-" .. i
                req_headers[#req_headers + 1] = { names[i], "client" .. i }
                resp_headers[#resp_headers + 1] = { names[i], "upstream" .. i }
            end
            req_headers[#req_headers + 1] = { "Connection", table.concat(names, ", ") }
            resp_headers[#resp_headers + 1] = { "Connection", table.concat(names, ", ") }
            up:program({ default = { status = 200, body = "ok", headers = resp_headers } })
            local resp = assert(H.request(gw.port, { path = "/hop", headers = req_headers }))
            assert.equal(200, resp.status)
            local hit = up:hits()[1]
            for i = 1, 20 do
                assert.same({}, hit_values(hit, names[i]), names[i] .. " reached the upstream")
                assert.same({}, H.header_values(resp, names[i]), names[i] .. " reached the client")
            end
        end)

        it("routes an absolute-form target by its authority, and $host says the same", function()
            local data = H.raw(gw.port, "GET http://b.test/abs HTTP/1.1\r\nHost: a.test\r\nConnection: close\r\n\r\n")
            assert.matches("^HTTP/1.1 200", data, ctx(gw))
            local hit = up:hits()[1]
            assert.same({ "b" }, hit_values(hit, "X-Server"))
            assert.same({ "b.test" }, hit_values(hit, "Host"))
            assert.equal("/abs", hit.target)
        end)

        it("does not forward header names with an underscore unless underscores_in_headers on", function()
            local headers = { { "X_Custom", "1" }, { "X-Custom", "2" } }
            assert.equal(200, assert(H.request(gw.port, { path = "/plain", headers = headers })).status)
            assert.equal(200, assert(H.request(gw.port, { path = "/underscores/", headers = headers })).status)
            local hits = up:hits()
            assert.same({}, hit_values(hits[1], "X_Custom"))
            assert.same({ "2" }, hit_values(hits[1], "X-Custom"))
            assert.same({ "1" }, hit_values(hits[2], "X_Custom"))
            assert.truthy(H.wait_until(function() return gw:log():find("underscore", 1, true) end, 3), ctx(gw))
        end)
    end)

    describe("closing after an answer", function()
        it("delivers every answer whole when keepalive_requests is reached with more requests waiting", function()
            local conn = assert(H.connect(gw.port))
            local one = "GET /k HTTP/1.1\r\nHost: a.test\r\n\r\n"
            -- more than the gateway reads ahead: some of it is still unread in the socket when it closes
            assert(conn:send(one:rep(4) .. ("x"):rep(256 * 1024)))
            local data, how = read_to_close(conn, 10)
            conn:close()
            local list = H.parse_responses(data)
            assert.equal(2, #list, ctx(gw, data))
            for _, r in ipairs(list) do
                assert.equal(200, r.status)
                assert.equal("ok", r.body)
            end
            assert.equal("closed", how, "the connection was reset, not closed")
        end)

        it("delivers a large HTTP/1.0 answer whole with pipelined bytes behind the request", function()
            local size = 4 * 1024 * 1024
            up:program({ default = { status = 200, body_size = size } })
            for round = 1, 3 do
                local conn = assert(H.connect(gw.port))
                assert(conn:send("GET /big HTTP/1.0\r\nHost: a.test\r\n\r\n" .. ("GET /next HTTP/1.1\r\nHost: a.test\r\n\r\n"):rep(8000)))
                socket.sleep(0.2) -- the gateway is done writing before the client reads
                local data, how = read_to_close(conn, 20)
                conn:close()
                local head_end = data:find("\r\n\r\n", 1, true)
                assert.truthy(head_end, ctx(gw, "round " .. round))
                assert.equal(size, #data - head_end - 3, "round " .. round .. ": body cut short")
                assert.equal("closed", how, "round " .. round .. ": reset")
            end
        end)
    end)

    describe("the access log", function()
        it("says why a failed answer was not retried", function()
            up:program({ default = { status = 503, body = "busy" } })
            local resp = assert(H.request(gw.port, { method = "POST", path = "/pay", body = "{}" }))
            assert.equal(503, resp.status)
            resp = assert(H.request(gw.port, { path = "/two/x" }))
            assert.equal(503, resp.status)
            up:program({ default = { status = 200, body = "ok" } })
            assert.equal(200, assert(H.request(gw.port, { path = "/fine" })).status)
            local lines = H.wait_until(function()
                local l = access_lines(gw)
                for _, e in ipairs(l) do
                    if e.path == "/fine" then return l end -- the last of the three is written
                end
            end, 3)
            assert.truthy(lines, ctx(gw))
            local by_path = {}
            for _, l in ipairs(lines) do by_path[l.path] = l end
            assert.equal("unsafe_method", by_path["/pay"].not_retried)
            assert.equal(1, #by_path["/pay"].attempts)
            assert.equal("attempts_exhausted", by_path["/two/x"].not_retried)
            assert.equal(2, #by_path["/two/x"].attempts)
            assert.is_nil(by_path["/fine"].not_retried)
        end)
    end)

    describe("finalize", function()
        it("ends a request whose client left during the backoff wait: no late attempt, logged as 499", function()
            up:program({ default = { status = 503, body = "busy" } })
            local conn = assert(H.connect(gw.port))
            assert(conn:send("GET /wait/x HTTP/1.1\r\nHost: a.test\r\n\r\n"))
            assert.truthy(#up:wait_hits(1, 20) == 1, ctx(gw))
            conn:close() -- the 3 s wait is pending
            local line = H.wait_until(function()
                for _, l in ipairs(access_lines(gw)) do
                    if l.path == "/wait/x" then return l end
                end
            end, 15)
            assert.truthy(line, ctx(gw))
            assert.equal(499, line.status)
            assert.equal(1, #line.attempts)
            assert.equal(503, line.attempts[1].status)
            -- the cancelled wait never fires: no second attempt, and the worker is fine
            socket.sleep(3.3)
            assert.equal(1, #up:hits())
            up:program({ default = { status = 200, body = "ok" } })
            assert.equal(200, assert(H.request(gw.port, { path = "/after" })).status)
        end)
    end)
end)

local FULL = [[
worker_processes 1;
worker_connections 4;
error_log logs/error.log info;
http {
    upstream u { server {{UPSTREAM}}; }
    server {
        listen 127.0.0.1:{{PORT}};
        location / { proxy_pass http://u; }
    }
}
]]

describe("a worker at worker_connections", function()
    local up, gw

    setup(function()
        up = H.start_upstream()
        gw = H.start_gateway({ conf = FULL, upstream = up })
    end)

    teardown(function()
        if gw then gw:stop() end
        if up then up:stop() end
    end)

    it("closes idle keep-alive connections to take a waiting client, not leave it in the backlog", function()
        -- four clients each made a request and keep their connection idle: the worker is full
        local idle = {}
        for i = 1, 4 do
            idle[i] = assert(H.connect(gw.port))
            local resp = H.request(gw.port, { path = "/idle/" .. i, conn = idle[i] })
            assert.equal(200, resp and resp.status, ctx(gw))
        end
        -- a fifth client is still served: an idle one made room
        local resp, err = H.request(gw.port, { path = "/fifth", timeout = 15 })
        assert.truthy(resp, ctx(gw, err))
        assert.equal(200, resp.status)
        local closed = 0
        for i = 1, 4 do
            if idle[i]:closed(0.5) then closed = closed + 1 end
            idle[i]:close()
        end
        assert.is_true(closed >= 1, "no idle connection was closed")
    end)

    it("answers with Connection: close while it is full of requests under way", function()
        -- answers of 8 s: the fourth connection comes while the three are upstream, however busy the machine
        up:reset()
        up:program({ routes = { ["/slow"] = { default = { status = 200, body = "slow", delay_ms = 8000 } } },
            default = 200 })
        local busy = {}
        for i = 1, 3 do
            busy[i] = assert(H.connect(gw.port))
            assert(busy[i]:send("GET /slow HTTP/1.1\r\nHost: a.test\r\n\r\n"))
        end
        assert.truthy(#up:wait_hits(3, 20) == 3, ctx(gw))
        -- the fourth connection fills the worker; nothing is idle: its answer closes it
        local c = assert(H.connect(gw.port))
        local resp = assert(H.request(gw.port, { path = "/last", conn = c, timeout = 15 }))
        assert.equal(200, resp.status)
        assert.equal("close", (resp.headers["connection"] or ""):lower())
        assert.truthy(c:closed(5))
        c:close()
        for i = 1, 3 do
            local r = busy[i]:read_response({ timeout = 30 })
            assert.equal(200, r and r.status, ctx(gw))
            busy[i]:close()
        end
    end)
end)

