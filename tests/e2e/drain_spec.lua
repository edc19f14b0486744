-- A retried answer's body never holds the retry: it drains beside it, its connection pooled when it
-- comes within upstream_drain_timeout and upstream_drain_max, closed when not (issue 35).
-- The upstream is the spec's own (a luasocket listener), so that the spec decides when each byte goes
-- and sees every connection the gateway opens: the ordering is the upstream's own record.
package.path = "tests/e2e/?.lua;" .. package.path
local H = require("helpers")
local socket = require("socket")

local gettime = socket.gettime

local CONF = [[
worker_processes 1;
error_log logs/error.log info;
http {
    upstream spec {
        server 127.0.0.1:{{UP}};
        keepalive 8;
        retry_budget off;
    }
    server {
        listen 127.0.0.1:{{PORT}};
        retry_attempts 3;
        retry_backoff 1ms 1ms jitter=none adaptive=off;
        # far from every wait of the spec (5 s): the drain ends by its bytes, not its time
        upstream_drain_timeout 60s;
        location / {
            proxy_pass http://spec;
        }
        # a drain that runs out of time long before the spec stops waiting for it
        location /short/ {
            upstream_drain_timeout 200ms;
            proxy_pass http://spec;
        }
        location /small/ {
            upstream_drain_max 1k;
            proxy_pass http://spec;
        }
        # the first attempt, unanswered, gets its hedge at once
        location /hedge/ {
            retry_hedge 1ms;
            proxy_pass http://spec;
        }
    }
}
]]

local WAIT = 5 -- s: every wait of the spec; a failure, never a pace

-- The spec's upstream: a listener and the connections it accepted, each with what it read.
local Up = {}
Up.__index = Up

local function new_upstream()
    local srv = assert(socket.bind("127.0.0.1", 0))
    srv:settimeout(0)
    local _, port = srv:getsockname()
    return setmetatable({ srv = srv, port = tonumber(port), conns = {} }, Up)
end

function Up:close()
    for _, c in ipairs(self.conns) do c.sock:close() end
    self.conns = {}
end

-- Reads what has arrived on c (non-blocking); false once the gateway closed it.
local function pump(c)
    for _ = 1, 1000 do
        local data, err, partial = c.sock:receive(65536)
        data = data or partial
        if data and #data > 0 then c.buf = c.buf .. data end
        if err == "closed" then
            c.closed = true
            return false
        end
        if err then return true end
    end
    return true
end

-- The next event, within WAIT: "request" (c has a whole request head, taken off its buffer), "closed"
-- (c, one of conns, was closed by the gateway), or nil + "timeout". A new connection is accepted and
-- watched.
function Up:next_event(conns)
    local deadline = gettime() + WAIT
    for _ = 1, 10000 do
        for _, c in ipairs(conns) do
            if not c.closed and not pump(c) then return "closed", c end
            local e = c.buf:find("\r\n\r\n", 1, true)
            if e then
                local head = c.buf:sub(1, e + 3)
                c.buf = c.buf:sub(e + 4)
                c.requests[#c.requests + 1] = head:match("^%u+ (%S+)")
                return "request", c
            end
        end
        local left = deadline - gettime()
        if left <= 0 then return nil, "timeout" end
        local watch = { self.srv }
        for _, c in ipairs(conns) do
            if not c.closed then watch[#watch + 1] = c.sock end
        end
        local ready = socket.select(watch, nil, math.min(left, 0.5))
        for _, s in ipairs(ready) do
            if s == self.srv then
                local sock = self.srv:accept()
                if sock then
                    sock:settimeout(0)
                    sock:setoption("tcp-nodelay", true)
                    local c = { sock = sock, buf = "", requests = {}, n = #self.conns + 1 }
                    self.conns[#self.conns + 1] = c
                    conns[#conns + 1] = c
                end
            end
        end
    end
    return nil, "timeout"
end

-- The next request on any connection (an event of another kind is an error).
function Up:request(conns)
    local what, c = self:next_event(conns)
    assert(what == "request", "wanted a request at the upstream, got " .. tostring(what) .. " "
        .. tostring(c and c.n or c))
    return c
end

local function send(c, bytes)
    c.sock:settimeout(WAIT)
    assert(c.sock:send(bytes))
    c.sock:settimeout(0)
end

local function head_503(length)
    return ("HTTP/1.1 503 Service Unavailable\r\nContent-Length: %d\r\n\r\n"):format(length)
end

local OK_CLOSE = "HTTP/1.1 200 OK\r\nContent-Length: 2\r\nConnection: close\r\n\r\nok"

describe("a retried answer's body", function()
    local up, gw

    setup(function()
        up = new_upstream()
        gw = H.start_gateway({ conf = CONF, vars = { UP = up.port } })
    end)

    teardown(function()
        if gw then gw:stop() end
        if up then up:close(); up.srv:close() end
    end)

    before_each(function()
        up:close()
    end)

    -- The first attempt's 503 head comes, its body not: the retry reaches the upstream first.
    local function first_503_then_retry(path, length)
        local client = assert(H.connect(gw.port))
        assert(client:send(H.build_request(gw.port, { path = path })))
        local conns = {}
        local a = up:request(conns)
        assert.equal(path, a.requests[1])
        send(a, head_503(length))
        return client, conns, a
    end

    -- Later requests until one comes on c (the others, on new connections, answered and closed):
    -- whether c went back to the pool.
    local function reused(client, conns, c, prefix)
        for i = 1, 20 do
            assert(client:send(H.build_request(gw.port, { path = prefix .. i })))
            local d = up:request(conns)
            if d == c then
                send(c, "HTTP/1.1 200 OK\r\nContent-Length: 4\r\n\r\nsame")
            else
                send(d, OK_CLOSE) -- the drain had not ended yet: a new connection, used once
                d.sock:close()
                d.closed = true
            end
            local r = assert(client:read_response())
            assert.equal(200, r.status)
            if d == c then
                assert.equal("same", r.body)
                return true
            end
        end
        return false
    end

    it("does not hold the retry, and its connection is reused once the body came", function()
        local client, conns, a = first_503_then_retry("/r1", 10)
        -- the upstream's record: the retry's request arrives while the first body is unsent and its
        -- connection still open (an older build closed it first, or waited for the body)
        local what, b = up:next_event(conns)
        assert.equal("request", what, "the retry did not come while the first body was held ("
            .. tostring(what) .. (b == a and ", the first connection was closed" or "") .. ")")
        assert.are_not.equal(a, b)
        assert.is_falsy(a.closed)
        send(b, OK_CLOSE)
        local resp = assert(client:read_response())
        assert.equal(200, resp.status)
        assert.equal("ok", resp.body)
        b.sock:close()
        b.closed = true
        -- the first body comes now: its connection goes back to the pool, and carries a later request
        send(a, "0123456789")
        assert.is_true(reused(client, conns, a, "/later"), "the drained connection never carried a later request")
        client:close()
    end)

    it("lets a dropped answer that a later one replaces drain alone, and reuses its connection", function()
        local client, conns, a = first_503_then_retry("/k1", 10)
        local b = up:request(conns)
        assert.are_not.equal(a, b)
        -- a whole 503: the answer of last resort now, in place of the first
        send(b, "HTTP/1.1 503 Service Unavailable\r\nContent-Length: 2\r\nConnection: close\r\n\r\nno")
        b.sock:close(); b.closed = true
        local c = up:request(conns)
        assert.is_falsy(a.closed, "the replaced answer's connection was closed")
        send(c, OK_CLOSE)
        assert.equal(200, assert(client:read_response()).status)
        c.sock:close(); c.closed = true
        send(a, "0123456789")
        assert.is_true(reused(client, conns, a, "/k1/later"), "the replaced answer's connection was not reused")
        client:close()
    end)

    it("lets a hedge's failed loser drain, and reuses its connection", function()
        local client = assert(H.connect(gw.port))
        assert(client:send(H.build_request(gw.port, { path = "/hedge/h" })))
        local conns = {}
        local a = up:request(conns)
        local b = up:request(conns) -- the hedge: the first attempt has no answer
        assert.are_not.equal(a, b)
        send(a, head_503(10)) -- the first fails while its hedge is out
        -- the hedge wins; its answer goes to the client while the first body is still held
        send(b, OK_CLOSE)
        assert.equal(200, assert(client:read_response()).status)
        b.sock:close(); b.closed = true
        assert.is_falsy(a.closed)
        send(a, "0123456789")
        assert.is_true(reused(client, conns, a, "/hedge/later"), "the hedge loser's connection was not reused")
        client:close()
    end)

    it("closes the connection when the body does not come within upstream_drain_timeout", function()
        local client, conns, a = first_503_then_retry("/short/r", 10)
        local b = up:request(conns)
        assert.are_not.equal(a, b)
        send(b, OK_CLOSE)
        local resp = assert(client:read_response())
        assert.equal(200, resp.status)
        b.sock:close()
        b.closed = true
        -- never sent: the gateway gives up on it
        local what, c = up:next_event({ a })
        assert.equal("closed", what)
        assert.equal(a, c)
        -- and a later request goes on a new connection
        assert(client:send(H.build_request(gw.port, { path = "/short/later" })))
        local d = up:request(conns)
        assert.are_not.equal(a, d)
        send(d, OK_CLOSE)
        assert.equal(200, assert(client:read_response()).status)
        client:close()
    end)

    it("closes the connection of a body larger than upstream_drain_max, and the retry succeeds", function()
        local client, conns, a = first_503_then_retry("/small/r", 5000)
        local seen_close, b
        for _ = 1, 3 do
            local what, c = up:next_event(conns)
            if what == "closed" then
                assert.equal(a, c)
                seen_close = true
            elseif what == "request" then
                b = c
            end
            if seen_close and b then break end
        end
        assert.is_true(seen_close, "the connection of a 5000-byte body (upstream_drain_max 1k) was kept")
        assert.truthy(b, "no retry reached the upstream")
        send(b, OK_CLOSE)
        local resp = assert(client:read_response())
        assert.equal(200, resp.status)
        assert.equal("ok", resp.body)
        client:close()
    end)
end)
