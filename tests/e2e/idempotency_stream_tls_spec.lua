-- A keyed request over TLS whose client closes right after its last body byte: the request outlives its client
-- and its answer is kept, whether the body streamed (> retry_body_max) or was held, and whether the close is a
-- FIN (the client read the server's TLS 1.3 session tickets) or a reset (it left them unread, as many clients
-- do: its kernel answers the close with a reset). The client closes only once the gateway's kernel has taken
-- (acknowledged) every byte of its request, so the whole body is the gateway's to read in every round; an
-- unkeyed request closed the same way must not stall the worker either. The real binary, a real LMDB file,
-- the fault upstream counting the requests it received whole.
package.path = "tests/e2e/?.lua;" .. package.path
local H = require("helpers")
local I = require("idem_helpers")

local ctx = H.context
local problem_type = I.problem_type

local STREAMED = 64 * 1024 -- over retry_body_max (1k): streams
local HELD = 512

-- How many requests to path the upstream received whole (one cut in its body never runs).
local function runs(up, path)
    local n = 0
    for _, h in ipairs(up:hits({ bodies = false })) do
        if h.path == path and not h.incomplete then n = n + 1 end
    end
    return n
end

local function body_of(len)
    local b = {}
    for i = 0, len - 1 do b[#b + 1] = string.char((i * 7) % 251) end
    return table.concat(b)
end

-- The client: TLS, a POST with a Content-Length body, then a wait (bounded) until the gateway's kernel
-- acknowledged every byte and the session tickets arrived; "fin" reads the tickets first (a plain close),
-- "rst" leaves them unread (the close is a reset). Exits non-zero when a wait's bound passed.
local CLIENT = [[
import fcntl, socket, ssl, struct, sys, termios, time
port, path, key, length, close = int(sys.argv[1]), sys.argv[2], sys.argv[3], int(sys.argv[4]), sys.argv[5]
ctx = ssl.create_default_context(); ctx.check_hostname = False; ctx.verify_mode = ssl.CERT_NONE
body = bytes((i * 7) % 251 for i in range(length))
s = ctx.wrap_socket(socket.create_connection(("127.0.0.1", port), 5))
head = "POST %s HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n" % (path, length)
if key:
    head += "Idempotency-Key: %s\r\n" % key
s.sendall(head.encode() + b"\r\n" + body)
def queued(req):
    return struct.unpack("i", fcntl.ioctl(s.fileno(), req, b"\0\0\0\0"))[0]
for _ in range(500):
    if queued(termios.TIOCOUTQ) == 0 and queued(termios.FIONREAD) > 0:
        break
    time.sleep(0.01)
else:
    sys.exit("the gateway never took the whole request, or no session ticket came")
if close == "fin":
    s.setblocking(False)
    for _ in range(100):
        try:
            s.recv(1)
            sys.exit("the gateway answered before the client closed")
        except ssl.SSLWantReadError:
            pass
        if queued(termios.FIONREAD) == 0:
            break
        time.sleep(0.01)
    else:
        sys.exit("the session tickets were never all read")
s.close()
]]

local CONF = [[
worker_processes 1;
error_log logs/error.log info;
http {
    access_log logs/access.log;
    upstream up { server {{UPSTREAM}}; retry_budget off; }
    server {
        listen 127.0.0.1:{{PORT}};
        listen 127.0.0.1:{{TPORT}} ssl;
        ssl_certificate {{DIR}}/cert.pem;
        ssl_certificate_key {{DIR}}/key.pem;
        retry_body_max 1k;
        idempotency_store lmdb:{{PREFIX}}/store size=16m;
        idempotency_lock_ttl 60s;
        location / { proxy_pass http://up; }
    }
}
]]

describe("a keyed request over TLS whose client closes after its last body byte", function()
    local dir, up, gw, tport, pid

    setup(function()
        local code, out = H.run({ "mktemp", "-d", "/tmp/ric-tlsclose-XXXXXX" })
        assert(code == 0, out)
        dir = out:gsub("%s+$", "")
        code, out = H.run({ "openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256",
            "-nodes", "-keyout", dir .. "/key.pem", "-out", dir .. "/cert.pem", "-days", "1", "-subj", "/CN=localhost" })
        assert(code == 0, out)
        H.write_file(dir .. "/client.py", CLIENT)
    end)

    teardown(function()
        if dir then H.run({ "rm", "-rf", dir }) end
    end)

    -- a gateway of its own for each case: a worker one case stalled does not fail the next
    before_each(function()
        up = H.start_upstream()
        tport = H.free_port()
        gw = H.start_gateway({ conf = CONF, upstream = up, vars = { DIR = dir, TPORT = tport } })
        pid = gw:workers()[1]
    end)

    after_each(function()
        if gw then gw:stop() end
        if up then up:stop() end
        gw, up = nil, nil
    end)

    -- One request sent and closed as `close` says while the upstream holds its answer; then the answer released.
    local function send_and_close(path, key, length, close)
        local release = dir .. "/release"
        up:reset()
        os.remove(release)
        up:program({ default = { status = 201, body = "stored-answer", hold_file = release } })
        local code, out = H.run({ "python3", dir .. "/client.py", tostring(tport), path, key or "", tostring(length),
            close })
        assert.equal(0, code, out)
        H.wait_until(function() return #up:hits({ bodies = false }) > 0 end, 5)
        H.write_file(release, "go")
    end

    local function worker_alive(what)
        assert.is_nil(gw:log():find("killed by the watchdog", 1, true), ctx(gw, what .. ": the worker stalled"))
        assert.equal(pid, gw:workers()[1], ctx(gw, what .. ": the worker was replaced"))
    end

    for _, case in ipairs({
        { "streamed", STREAMED, "rst" }, { "streamed", STREAMED, "fin" },
        { "held", HELD, "rst" }, { "held", HELD, "fin" },
    }) do
        local kind, length, close = case[1], case[2], case[3]
        it(("keeps the answer of a %s body whose client closes with a %s"):format(kind, close), function()
            local body = body_of(length)
            -- a few rounds: the close may reach the gateway before or after it read the body
            for round = 1, 3 do
                local key = I.new_key(kind .. close .. round)
                send_and_close("/up", key, length, close)
                -- the same request again (plain TCP): 409 while it runs, then the stored answer
                local r
                H.wait_until(function()
                    r = I.post(gw.port, "/up", key, body)
                    if r and r.status == 409 and problem_type(r) == "urn:ricochet:problem:idempotency-key-in-use" then
                        H.sleep(0.1)
                        return nil
                    end
                    return true
                end, 20)
                local what = ("%s/%s round %d"):format(kind, close, round)
                worker_alive(what)
                assert.equal(201, r and r.status, ctx(gw, what .. ": " .. (r and r.body or "no answer")))
                assert.equal("stored-answer", r.body)
                assert.equal(1, runs(up, "/up"), ctx(gw, what .. ": the upstream did not run it exactly once"))
            end
        end)
    end

    it("keeps serving after an unkeyed streamed request whose client closes", function()
        for _, close in ipairs({ "rst", "fin" }) do
            send_and_close("/plain", nil, STREAMED, close)
            assert.truthy(H.wait_until(function() return gw:log():find("/plain", 1, true) end, 10), ctx(gw))
            up:reset()
            up:program({ default = { status = 200, body = "fine" } })
            local r = H.request(gw.port, { path = "/after" })
            worker_alive("unkeyed " .. close)
            assert.equal(200, r and r.status, ctx(gw, close))
            assert.equal("fine", r.body)
        end
    end)
end)
