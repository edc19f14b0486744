-- Shared e2e test helpers: start/stop the fault upstream and the ricochet gateway, and a small raw HTTP/1.1 client.
--
-- Specs load it with: package.path = "tests/e2e/?.lua;" .. package.path; local H = require("helpers")
-- Every wait below is bounded in both iterations and wall time, so a broken gateway fails a test instead of hanging it.

local socket = require("socket")
local cjson = require("cjson")
local ffi = require("ffi")
local bit = require("bit")

local H = {}
H.json = cjson

local gettime = socket.gettime
local LOOPBACK = "127.0.0.1"
local BODY_PATTERN = "0123456789abcdef" -- must match tests/tools/fault_upstream.lua

---------------------------------------------------------------------------
-- Paths and small file utilities
---------------------------------------------------------------------------

local function dirname(p)
    return p:match("^(.*)/[^/]*$") or "."
end

local function current_dir()
    local ok, lfs = pcall(require, "lfs")
    if ok then return lfs.currentdir() end
    return os.getenv("PWD") or "."
end

-- The repo root is two levels above this file, whatever directory busted was started from.
local function find_root()
    local src = debug.getinfo(1, "S").source:gsub("^@", "")
    if src:sub(1, 1) ~= "/" then src = current_dir() .. "/" .. src end
    local root = dirname(dirname(dirname(src)))
    return (root:gsub("/%./", "/"):gsub("/%.$", ""))
end

H.root = find_root()
H.upstream_script = H.root .. "/tests/tools/fault_upstream.lua"

function H.bin()
    local env = os.getenv("RICOCHET_BIN")
    if env and env ~= "" then return env end
    return H.root .. "/build/ricochet"
end

local function read_file(path)
    local f = io.open(path, "rb")
    if not f then return nil end
    local s = f:read("*a")
    f:close()
    return s
end
H.read_file = read_file

-- A gateway's error log for an assertion's message, after what extra says.
function H.context(gw, extra)
    return (extra and (tostring(extra) .. "\n") or "") .. "gateway log:\n" .. (gw and gw:log() or "?")
end

-- A process's resident memory (/proc/PID/status VmRSS), in KiB, or nil when it is gone.
function H.rss_kib(pid)
    local s = read_file("/proc/" .. pid .. "/status")
    return s and tonumber(s:match("VmRSS:%s*(%d+)"))
end

-- Whether the binary under test is an AddressSanitizer build: its allocator keeps freed memory in
-- quarantine, so only a plain build can show memory given back.
function H.sanitized()
    local f = assert(io.open(H.bin(), "rb"))
    local yes = f:read("*a"):find("__asan_", 1, true) ~= nil
    f:close()
    return yes
end

local function write_file(path, data)
    local f = assert(io.open(path, "wb"))
    assert(f:write(data))
    f:close()
end
H.write_file = write_file

local function shell_quote(s)
    return "'" .. tostring(s):gsub("'", "'\\''") .. "'"
end
H.shell_quote = shell_quote

-- Deterministic body the fault upstream produces for body_size = n.
-- Deterministic pseudo-random printable bytes, unlike the upstream's own pattern (so an echo can't fake a match).
function H.text_body(n, seed)
    local out, x = {}, seed or 12345
    for i = 1, n do
        x = (x * 1103515245 + 12345) % 2147483648
        out[i] = string.char(33 + (x % 94))
    end
    return table.concat(out)
end

function H.body_of_size(n)
    if n <= 0 then return "" end
    return BODY_PATTERN:rep(math.floor(n / #BODY_PATTERN) + 1):sub(1, n)
end

function H.sleep(seconds)
    socket.sleep(seconds)
end

---------------------------------------------------------------------------
-- Processes via FFI posix_spawn: gives us the real pid, non-blocking waitpid (so children are reaped and their
-- exit status is known) and clean signal dispositions (busted ignores SIGPIPE; the gateway must not inherit that).
---------------------------------------------------------------------------

local CDEFS = {
    "typedef union { void *align; char bytes[512]; } ric_spawn_actions_t;",
    "typedef union { void *align; char bytes[1024]; } ric_spawn_attr_t;",
    "typedef union { unsigned long align; char bytes[128]; } ric_sigset_t;",
    "int posix_spawn_file_actions_init(ric_spawn_actions_t *fa);",
    "int posix_spawn_file_actions_destroy(ric_spawn_actions_t *fa);",
    "int posix_spawn_file_actions_addopen(ric_spawn_actions_t *fa, int fd, const char *path, int oflag, unsigned int mode);",
    "int posix_spawn_file_actions_adddup2(ric_spawn_actions_t *fa, int fd, int newfd);",
    "int posix_spawn_file_actions_addclose(ric_spawn_actions_t *fa, int fd);",
    "int posix_spawn_file_actions_addclosefrom_np(ric_spawn_actions_t *fa, int from);",
    "int posix_spawnattr_init(ric_spawn_attr_t *attr);",
    "int posix_spawnattr_destroy(ric_spawn_attr_t *attr);",
    "int posix_spawnattr_setflags(ric_spawn_attr_t *attr, short flags);",
    "int posix_spawnattr_setsigdefault(ric_spawn_attr_t *attr, const ric_sigset_t *set);",
    "int posix_spawnattr_setsigmask(ric_spawn_attr_t *attr, const ric_sigset_t *set);",
    "int sigemptyset(ric_sigset_t *set);",
    "int sigaddset(ric_sigset_t *set, int sig);",
    "int posix_spawnp(int *pid, const char *file, const ric_spawn_actions_t *fa, const ric_spawn_attr_t *attr,"
        .. " char *const argv[], char *const envp[]);",
    "int waitpid(int pid, int *status, int options);",
    "long recv(int fd, void *buf, unsigned long n, int flags);",
    "int kill(int pid, int sig);",
    "char *mkdtemp(char *tmpl);",
    "int poll(void *fds, unsigned long nfds, int timeout);",
    "char *strerror(int errnum);",
    "extern char **environ;",
}
-- one declaration at a time: busted may load this module again per spec file and the FFI refuses redefinitions
for _, decl in ipairs(CDEFS) do pcall(ffi.cdef, decl) end
local C = ffi.C

local O_WRONLY, O_CREAT, O_TRUNC = 1, 64, 512
local WNOHANG = 1
local SPAWN_SETSIGDEF, SPAWN_SETSIGMASK = 0x04, 0x08

local SIGNALS = {
    HUP = 1, INT = 2, QUIT = 3, ILL = 4, TRAP = 5, ABRT = 6, BUS = 7, FPE = 8, KILL = 9, USR1 = 10, SEGV = 11,
    USR2 = 12, PIPE = 13, ALRM = 14, TERM = 15, CHLD = 17, CONT = 18, STOP = 19, TSTP = 20, TTIN = 21, TTOU = 22,
    URG = 23, XCPU = 24, XFSZ = 25, VTALRM = 26, PROF = 27, WINCH = 28, IO = 29, SYS = 31,
}

local function signum(name)
    if type(name) == "number" then return name end
    local n = SIGNALS[tostring(name):upper():gsub("^SIG", "")]
    if not n then error("unknown signal " .. tostring(name), 3) end
    return n
end
H.signum = signum

local function strerror(e)
    return ffi.string(C.strerror(e))
end

local function mkdtemp(tag)
    local buf = ffi.new("char[?]", 256)
    ffi.copy(buf, ("/tmp/ricochet-%s.XXXXXX"):format(tag or "e2e"))
    if C.mkdtemp(buf) == nil then error("mkdtemp: " .. strerror(ffi.errno())) end
    return ffi.string(buf)
end
H.mkdtemp = mkdtemp

local function rm_rf(path)
    -- only ever our own mkdtemp results: refuse anything else
    if type(path) == "string" and path:find("^/tmp/ricochet%-[%w%-]+%.[%w]+$") then
        os.execute("rm -rf " .. shell_quote(path))
    end
end
H.rm_rf = rm_rf

local function build_env(overrides)
    if not overrides then return C.environ end
    local list, seen = {}, {}
    for k, v in pairs(overrides) do
        seen[k] = true
        if v ~= false then list[#list + 1] = k .. "=" .. tostring(v) end
    end
    local env = C.environ
    for i = 0, 100000 do
        if env[i] == nil then break end
        local entry = ffi.string(env[i])
        local name = entry:match("^([^=]*)=")
        if not (name and seen[name]) then list[#list + 1] = entry end
    end
    local arr = ffi.new("char *[?]", #list + 1)
    for i, s in ipairs(list) do arr[i - 1] = ffi.cast("char *", s) end
    return arr, list -- list keeps the strings alive while arr points into them
end

-- spawn{argv = {...}, stdout = path, stderr = path | "stdout", env = {NAME = value|false}} -> pid
local function spawn(o)
    local argv = o.argv
    local keep = {}
    local cargv = ffi.new("char *[?]", #argv + 1)
    for i, a in ipairs(argv) do
        keep[i] = tostring(a)
        cargv[i - 1] = ffi.cast("char *", keep[i])
    end
    local envp, envkeep = build_env(o.env)

    local fa = ffi.new("ric_spawn_actions_t")
    local attr = ffi.new("ric_spawn_attr_t")
    assert(C.posix_spawn_file_actions_init(fa) == 0)
    assert(C.posix_spawnattr_init(attr) == 0)
    C.posix_spawn_file_actions_addopen(fa, 0, "/dev/null", 0, 0)
    C.posix_spawn_file_actions_addopen(fa, 1, o.stdout or "/dev/null", O_WRONLY + O_CREAT + O_TRUNC, 420)
    if o.stderr == "stdout" then
        C.posix_spawn_file_actions_adddup2(fa, 1, 2)
    else
        C.posix_spawn_file_actions_addopen(fa, 2, o.stderr or "/dev/null", O_WRONLY + O_CREAT + O_TRUNC, 420)
    end
    -- our test sockets must not leak into the child, or closing them here would not close the connection
    if not pcall(function() return C.posix_spawn_file_actions_addclosefrom_np end)
        or C.posix_spawn_file_actions_addclosefrom_np(fa, 3) ~= 0 then
        for fd = 3, 1023 do C.posix_spawn_file_actions_addclose(fa, fd) end
    end
    local set = ffi.new("ric_sigset_t")
    C.sigemptyset(set)
    for sig = 1, 31 do
        if sig ~= 9 and sig ~= 19 then C.sigaddset(set, sig) end
    end
    C.posix_spawnattr_setsigdefault(attr, set)
    local empty = ffi.new("ric_sigset_t")
    C.sigemptyset(empty)
    C.posix_spawnattr_setsigmask(attr, empty)
    C.posix_spawnattr_setflags(attr, SPAWN_SETSIGDEF + SPAWN_SETSIGMASK)

    local pid = ffi.new("int[1]")
    local rc = C.posix_spawnp(pid, keep[1], fa, attr, cargv, envp)
    C.posix_spawn_file_actions_destroy(fa)
    C.posix_spawnattr_destroy(attr)
    local _ = envkeep
    if rc ~= 0 then return nil, ("spawn %s: %s"):format(keep[1], strerror(rc)) end
    return pid[0]
end

-- Decodes a waitpid status the shell way: exit code, or 128 + signal number.
local function decode_status(st)
    local sig = bit.band(st, 0x7f)
    if sig == 0 then return bit.rshift(bit.band(st, 0xff00), 8), "exit", bit.rshift(bit.band(st, 0xff00), 8) end
    return 128 + sig, "signal", sig
end

-- Process registry so anything a failing test forgot is still killed when busted's Lua state closes.
local live_procs = {}

local Proc = {}
Proc.__index = Proc

local function new_proc(pid, extra)
    local p = setmetatable(extra or {}, Proc)
    p.pid = pid
    live_procs[p] = true
    return p
end

-- Non-blocking reap; returns the exit status once the process is gone.
function Proc:poll()
    if self.exit_code then return self.exit_code, self.exit_kind, self.exit_value end
    local st = ffi.new("int[1]")
    local r = C.waitpid(self.pid, st, WNOHANG)
    if r == self.pid then
        self.exit_code, self.exit_kind, self.exit_value = decode_status(st[0])
        live_procs[self] = nil
        return self.exit_code, self.exit_kind, self.exit_value
    elseif r == -1 then
        -- not our child any more (reaped elsewhere): report it as gone with an unknown status
        self.exit_code, self.exit_kind = -1, "unknown"
        live_procs[self] = nil
        return self.exit_code, self.exit_kind
    end
    return nil
end

function Proc:alive()
    return self:poll() == nil
end

-- Waits up to `seconds` (default 5) for exit; returns exit status (code, or 128+signal), kind, value; or nil.
function Proc:wait_exit(seconds)
    local deadline = gettime() + (seconds or 5)
    for _ = 1, 100000 do
        local code, kind, value = self:poll()
        if code then return code, kind, value end
        if gettime() >= deadline then return nil end
        socket.sleep(0.02)
    end
    return nil
end

function Proc:signal(name)
    if self:poll() then return false end
    return C.kill(self.pid, signum(name)) == 0
end

-- SIGTERM, bounded wait, then SIGKILL and reap.
function Proc:terminate(grace)
    if self:poll() then return self.exit_code end
    self:signal("TERM")
    local code = self:wait_exit(grace or 5)
    if code then return code end
    self:signal("KILL")
    return self:wait_exit(5)
end

-- /proc based process table: {pid = {ppid=, state=}}
local function list_procs()
    local procs = {}
    local ok, lfs = pcall(require, "lfs")
    local names = {}
    if ok then
        for name in lfs.dir("/proc") do
            if name:find("^%d+$") then names[#names + 1] = name end
        end
    else
        local f = io.popen("ls /proc")
        for name in f:lines() do
            if name:find("^%d+$") then names[#names + 1] = name end
        end
        f:close()
    end
    for _, name in ipairs(names) do
        local stat = read_file("/proc/" .. name .. "/stat")
        -- comm may contain spaces or parens, so parse after the last ')'
        local rest = stat and stat:match("^.*%)%s+(.*)$")
        if rest then
            local state, ppid = rest:match("^(%S+)%s+(%d+)")
            procs[tonumber(name)] = { state = state, ppid = tonumber(ppid) }
        end
    end
    return procs
end

-- All live descendants of pid (workers and whatever they forked).
local function descendants(pid)
    local procs = list_procs()
    local out, frontier = {}, { pid }
    for _ = 1, 10 do
        local next_frontier = {}
        for p, info in pairs(procs) do
            for _, parent in ipairs(frontier) do
                if info.ppid == parent and info.state ~= "Z" then
                    out[#out + 1] = p
                    next_frontier[#next_frontier + 1] = p
                end
            end
        end
        if #next_frontier == 0 then break end
        frontier = next_frontier
    end
    return out
end
H.descendants = descendants

local function pid_alive(pid)
    local stat = read_file("/proc/" .. pid .. "/stat")
    local state = stat and stat:match("^.*%)%s+(%S+)")
    return state ~= nil and state ~= "Z"
end

H.pid_alive = function(pid) return pid_alive(pid) end

local function kill_leftovers(pids, sig)
    for _, p in ipairs(pids) do
        if pid_alive(p) then C.kill(p, sig) end
    end
end

-- Used from the exit finalizer too, so only plain FFI calls: C modules such as socket or lfs may already be
-- unloaded while the Lua state closes.
local exit_status = ffi.new("int[1]")
local function stop_all()
    local pending = {}
    for p in pairs(live_procs) do
        if not p.exit_code and C.waitpid(p.pid, exit_status, WNOHANG) == 0 then
            C.kill(p.pid, 15) -- TERM first so a gateway master can take its workers down with it
            pending[#pending + 1] = p
        end
        live_procs[p] = nil
    end
    for _ = 1, 150 do
        local left = 0
        for _, p in ipairs(pending) do
            if not p.exit_code then
                if C.waitpid(p.pid, exit_status, WNOHANG) ~= 0 then p.exit_code = -1 else left = left + 1 end
            end
        end
        if left == 0 then return end
        C.poll(nil, 0, 20)
    end
    for _, p in ipairs(pending) do
        if not p.exit_code then
            C.kill(p.pid, 9)
            C.waitpid(p.pid, exit_status, 0)
            p.exit_code = -1
        end
    end
end
H.stop_all = stop_all

-- A userdata whose finalizer runs when the Lua state closes at busted's exit.
H._reaper = newproxy(true)
getmetatable(H._reaper).__gc = function() pcall(stop_all) end

---------------------------------------------------------------------------
-- Sockets
---------------------------------------------------------------------------

-- Ports are allocated with all sockets held open at once so one call never returns the same port twice.
function H.free_ports(n)
    local socks, ports = {}, {}
    for i = 1, n do
        local s = assert(socket.tcp())
        assert(s:bind(LOOPBACK, 0))
        local _, port = s:getsockname()
        socks[i], ports[i] = s, tonumber(port)
    end
    for _, s in ipairs(socks) do s:close() end
    return ports
end

function H.free_port()
    return H.free_ports(1)[1]
end

-- Ports that refuse every connection for as long as this busted process runs: each is bound and never listened
-- on, so no other process can take it meanwhile (a port merely found free could be taken by another test run
-- and answer).
local held = {}
function H.dead_ports(n)
    local ports = {}
    for i = 1, n do
        local s = assert(socket.tcp())
        assert(s:bind(LOOPBACK, 0))
        local _, port = s:getsockname()
        held[#held + 1] = s
        ports[i] = tonumber(port)
    end
    return ports
end

function H.dead_port()
    return H.dead_ports(1)[1]
end

-- Reads with recv(2) through the FFI instead of LuaSocket, because LuaSocket reports a reset as "closed" and
-- tests need to tell a clean close (FIN) from an abortive one (RST).
local MSG_DONTWAIT, EINTR, EAGAIN, ECONNRESET = 0x40, 4, 11, 104
local RECV_CHUNK = 65536
local recv_buf = ffi.new("char[?]", RECV_CHUNK)

-- Returns a filler over a connected socket: fill(deadline) -> data, or nil + "timeout" / "closed" (FIN) /
-- "reset" (RST) / another error string. Errors are sticky.
local function socket_filler(sock)
    local fd = sock:getfd()
    local eof_err
    return function(deadline)
        if eof_err then return nil, eof_err end
        local parts, have = {}, 0
        for _ = 1, 100000 do
            local n = tonumber(C.recv(fd, recv_buf, RECV_CHUNK, MSG_DONTWAIT))
            if n > 0 then
                parts[#parts + 1] = ffi.string(recv_buf, n)
                have = have + n
                if have >= 1024 * 1024 then break end
            elseif n == 0 then
                eof_err = "closed"
                break
            else
                local e = ffi.errno()
                if e == EAGAIN then
                    if have > 0 then break end
                    local left = deadline - gettime()
                    if left <= 0 then return nil, "timeout" end
                    socket.select({ sock }, nil, math.min(left, 0.5))
                elseif e ~= EINTR then
                    eof_err = e == ECONNRESET and "reset" or strerror(e)
                    break
                end
            end
        end
        if have > 0 then return table.concat(parts) end
        return nil, eof_err or "timeout"
    end
end

---------------------------------------------------------------------------
-- Response parsing over a buffered reader (socket or string)
---------------------------------------------------------------------------

local Reader = {}
Reader.__index = Reader

local function new_reader(fill, initial)
    return setmetatable({ buf = initial or "", fill = fill }, Reader)
end

function Reader:more(deadline)
    local data, err = self.fill(deadline)
    if not data then
        self.err = err
        return false
    end
    self.buf = self.buf .. data
    return true
end

function Reader:head(deadline, limit)
    for _ = 1, 1000000 do
        local s, e = self.buf:find("\r?\n\r?\n")
        if s then
            local head = self.buf:sub(1, s - 1)
            self.buf = self.buf:sub(e + 1)
            return head
        end
        if #self.buf > limit then return nil, "response head too large" end
        if not self:more(deadline) then return nil, self.err end
    end
    return nil, "too many reads"
end

function Reader:line(deadline)
    for _ = 1, 1000000 do
        local e = self.buf:find("\n", 1, true)
        if e then
            local line = self.buf:sub(1, e - 1):gsub("\r$", "")
            self.buf = self.buf:sub(e + 1)
            return line
        end
        if #self.buf > 65536 then return nil, "line too long" end
        if not self:more(deadline) then return nil, self.err end
    end
    return nil, "too many reads"
end

-- Exactly n bytes; on failure returns nil, err, partial. Pieces are joined once so big bodies stay cheap.
function Reader:exact(n, deadline)
    if #self.buf >= n then
        local out = self.buf:sub(1, n)
        self.buf = self.buf:sub(n + 1)
        return out
    end
    local parts, have = { self.buf }, #self.buf
    self.buf = ""
    for _ = 1, 10000000 do
        if have >= n then break end
        local data, err = self.fill(deadline)
        if not data then
            self.err = err
            return nil, err, table.concat(parts)
        end
        parts[#parts + 1] = data
        have = have + #data
    end
    local all = table.concat(parts)
    self.buf = all:sub(n + 1)
    return all:sub(1, n)
end

-- Everything until the peer closes; returns data, err ("closed" is the clean case).
function Reader:to_eof(deadline)
    local parts = { self.buf }
    self.buf = ""
    for _ = 1, 10000000 do
        local data, err = self.fill(deadline)
        if not data then
            self.err = err
            return table.concat(parts), err
        end
        parts[#parts + 1] = data
    end
    return table.concat(parts), "too many reads"
end

local function parse_head(head)
    local lines = {}
    for line in (head .. "\n"):gmatch("(.-)\r?\n") do lines[#lines + 1] = line end
    local version, status, reason = lines[1]:match("^(HTTP/%d%.%d) (%d%d%d) ?(.*)$")
    if not version then return nil, "bad status line: " .. lines[1] end
    local resp = { version = version, status = tonumber(status), reason = reason, raw_head = head }
    local headers, list = {}, {}
    for i = 2, #lines do
        local name, value = lines[i]:match("^([^:%s]+):[ \t]*(.-)[ \t]*$")
        if not name then return nil, "bad header line: " .. lines[i] end
        list[#list + 1] = { name, value }
        headers[#list] = list[#list]
        headers[name:lower()] = value
    end
    -- headers: lowercase name -> last value, plus the ordered {name, value} pairs at 1..n; header_list: pairs only
    resp.headers, resp.header_list = headers, list
    return resp
end

-- All values of a header (any case), in order: of a parsed response (its header_list), or of an upstream hit
-- record from up:hits() (its headers).
local function values_in(list, name)
    local out = {}
    name = name:lower()
    for _, h in ipairs(list or {}) do
        if h[1]:lower() == name then out[#out + 1] = h[2] end
    end
    return out
end

function H.header_values(resp, name) return values_in(resp.header_list, name) end
function H.hit_values(hit, name) return values_in(hit.headers, name) end

-- The value of the request field `name` that up saw on one request through the gateway at
-- gw_port (the program reset first), or nil when it was not answered 200.
function H.seen_upstream(gw_port, up, name)
    up:reset()
    local r = H.request(gw_port, { path = "/seen" })
    if not r or r.status ~= 200 then return nil end
    local hits = up:hits()
    return hits[#hits] and H.hit_values(hits[#hits], name)[1]
end

local function read_chunked(rd, deadline, resp)
    local parts, trailers = {}, {}
    resp.trailers = trailers
    for _ = 1, 10000000 do
        local line, err = rd:line(deadline)
        if not line then return nil, err, table.concat(parts) end
        local hex = line:match("^(%x+)")
        if not hex then return nil, "bad chunk size line: " .. line, table.concat(parts) end
        local size = tonumber(hex, 16)
        if size == 0 then
            for _ = 1, 1000 do
                local t, terr = rd:line(deadline)
                if not t then return nil, terr, table.concat(parts) end
                if t == "" then return table.concat(parts) end
                local name, value = t:match("^([^:%s]+):[ \t]*(.-)[ \t]*$")
                trailers[#trailers + 1] = { name or t, value or "" }
            end
            return nil, "too many trailers", table.concat(parts)
        end
        local data, derr, partial = rd:exact(size, deadline)
        if not data then
            parts[#parts + 1] = partial
            return nil, derr, table.concat(parts)
        end
        parts[#parts + 1] = data
        local crlf, cerr = rd:line(deadline)
        if crlf ~= "" then return nil, cerr or "chunk data not followed by CRLF", table.concat(parts) end
    end
    return nil, "too many chunks", table.concat(parts)
end

-- Reads one final response (1xx interim ones are collected in resp.interim).
-- Returns resp, or nil, err, partial_resp (partial_resp.body holds what arrived before the failure).
local function read_response(rd, deadline, method)
    local interim = {}
    for _ = 1, 100 do
        local head, err = rd:head(deadline, 1024 * 1024)
        if not head then
            return nil, err
        end
        local resp, perr = parse_head(head)
        if not resp then return nil, perr end
        if resp.status >= 100 and resp.status < 200 and resp.status ~= 101 then
            interim[#interim + 1] = resp
        else
            resp.interim = interim
            local te, cl = resp.headers["transfer-encoding"], resp.headers["content-length"]
            local body, berr, partial
            if method == "HEAD" or resp.status < 200 or resp.status == 204 or resp.status == 304 then
                body = ""
            elseif te and te:lower():find("chunked%s*$") then
                resp.chunked = true
                body, berr, partial = read_chunked(rd, deadline, resp)
            elseif cl then
                local n = tonumber(cl)
                if not n then return nil, "bad content-length: " .. cl, resp end
                body, berr, partial = rd:exact(n, deadline)
            else
                resp.until_close = true
                body, berr = rd:to_eof(deadline)
                if berr ~= "closed" then partial, body = body, nil end
            end
            if not body then
                resp.body, resp.incomplete = partial or "", true
                return nil, berr, resp
            end
            resp.body = body
            return resp
        end
    end
    return nil, "too many interim responses"
end

-- Parses every response in a raw byte string (pipelining checks). opts.methods[i] / opts.method mark HEAD answers.
-- Returns the list, plus an error string and the failing partial response if the bytes end mid-response.
function H.parse_responses(str, opts)
    opts = opts or {}
    local rd = new_reader(function() return nil, "closed" end, str)
    local out = {}
    for i = 1, 100000 do
        if rd.buf == "" then return out end
        local method = (opts.methods and opts.methods[i]) or opts.method
        local resp, err, partial = read_response(rd, gettime() + 1, method)
        if not resp then return out, err, partial end
        out[#out + 1] = resp
    end
    return out
end

---------------------------------------------------------------------------
-- Client connections
---------------------------------------------------------------------------

local function normalize_headers(h)
    local list = {}
    if not h then return list end
    if h[1] ~= nil then
        for _, p in ipairs(h) do list[#list + 1] = { p[1], p[2] } end
        return list
    end
    local names = {}
    for k in pairs(h) do names[#names + 1] = k end
    table.sort(names) -- stable order keeps test failures reproducible
    for _, k in ipairs(names) do
        local v = h[k]
        if type(v) == "table" then
            for _, x in ipairs(v) do list[#list + 1] = { k, x } end
        else
            list[#list + 1] = { k, v }
        end
    end
    return list
end

local function chunk_encode(body, size)
    local out = {}
    for i = 1, #body, size do
        local piece = body:sub(i, i + size - 1)
        out[#out + 1] = ("%x\r\n"):format(#piece) .. piece .. "\r\n"
    end
    out[#out + 1] = "0\r\n\r\n"
    return table.concat(out)
end

-- Serializes req = {method, path, version, headers (list of pairs or map), body, chunked, chunk_size,
-- no_host, no_content_length}. Host and Content-Length are added unless present or disabled.
function H.build_request(port, req)
    local method = req.method or "GET"
    local list = normalize_headers(req.headers)
    local has = {}
    for _, h in ipairs(list) do has[h[1]:lower()] = true end
    if not has.host and not req.no_host then
        table.insert(list, 1, { "Host", LOOPBACK .. ":" .. tostring(port or 80) })
    end
    local body = req.body
    if req.chunked then
        if not has["transfer-encoding"] then list[#list + 1] = { "Transfer-Encoding", "chunked" } end
        body = chunk_encode(body or "", req.chunk_size or 4096)
    elseif body and not has["content-length"] and not has["transfer-encoding"] and not req.no_content_length then
        list[#list + 1] = { "Content-Length", tostring(#body) }
    end
    local out = { ("%s %s %s\r\n"):format(method, req.path or "/", req.version or "HTTP/1.1") }
    for _, h in ipairs(list) do out[#out + 1] = h[1] .. ": " .. tostring(h[2]) .. "\r\n" end
    out[#out + 1] = "\r\n"
    out[#out + 1] = body or ""
    return table.concat(out)
end

local Conn = {}
Conn.__index = Conn

-- H.connect(port, {timeout = connect seconds}) -> conn, or nil + error.
function H.connect(port, opts)
    opts = opts or {}
    local sock = socket.tcp()
    sock:settimeout(opts.timeout or 3)
    local ok, err = sock:connect(LOOPBACK, port)
    if not ok then
        sock:close()
        return nil, err
    end
    sock:setoption("tcp-nodelay", true)
    sock:settimeout(0)
    local c = setmetatable({ sock = sock, port = port }, Conn)
    c.reader = new_reader(socket_filler(sock))
    return c
end

-- Sends all bytes (bounded by timeout, default 5 s). Returns true or nil, err.
function Conn:send(bytes, timeout)
    self.sock:settimeout(timeout or 5)
    local ok, err = self.sock:send(bytes)
    self.sock:settimeout(0)
    if not ok then return nil, err end
    return true
end

-- Parses the next response on the stream; opts.method = "HEAD" for bodiless answers, opts.timeout (default 5 s).
-- Returns resp, or nil, err, partial_resp.
function Conn:read_response(opts)
    opts = opts or {}
    return read_response(self.reader, gettime() + (opts.timeout or 5), opts.method)
end

-- Sends req (see H.build_request) and reads its response.
function Conn:request(req)
    local ok, err = self:send(H.build_request(self.port, req), req.timeout)
    if not ok then return nil, err end
    return self:read_response({ method = req.method, timeout = req.timeout })
end

-- Everything that arrives within `timeout` seconds (default 1) or until the peer closes: data, closed, err.
function Conn:read_all(timeout)
    local data, err = self.reader:to_eof(gettime() + (timeout or 1))
    return data, err ~= "timeout", err
end

-- True (plus "closed" for FIN or "reset" for RST) if the peer closes within `wait` seconds (default 1).
-- Bytes arriving meanwhile stay buffered for read_response.
function Conn:closed(wait)
    local deadline = gettime() + (wait or 1)
    for _ = 1, 100000 do
        local data, err = self.reader.fill(deadline)
        if data then
            self.reader.buf = self.reader.buf .. data
        elseif err == "timeout" then
            return false
        else
            return true, err
        end
    end
    return false
end

function Conn:close()
    if not self.is_closed then
        self.sock:close()
        self.is_closed = true
    end
end

-- One request: req.conn reuses a connection (kept open), otherwise a fresh one is opened and closed.
-- req.timeout bounds the whole exchange (default 5 s). Returns resp or nil, err, partial_resp.
function H.request(port, req)
    req = req or {}
    local conn = req.conn
    if not conn then
        local err
        conn, err = H.connect(port, { timeout = req.timeout })
        if not conn then return nil, err end
    end
    local resp, err, partial = conn:request(req)
    if not req.conn then conn:close() end
    return resp, err, partial
end

-- Sends bytes (or opts.pieces: a list of strings, or a count to split bytes into) with opts.pause seconds
-- between pieces, then reads until the peer closes, opts.timeout (default 3 s) passes, or opts["until"]
-- (a Lua pattern or function of the data so far) is satisfied. opts.shutdown half-closes after sending.
-- Returns data, closed (peer closed or reset), err ("closed" = FIN, "reset" = RST, "timeout", ...).
function H.raw(port, bytes, opts)
    opts = opts or {}
    local conn, err = H.connect(port)
    if not conn then return nil, false, err end
    local pieces = opts.pieces
    if type(pieces) == "number" then
        local n, size = pieces, math.max(1, math.ceil(#bytes / pieces))
        pieces = {}
        for i = 1, math.min(n, #bytes) do pieces[i] = bytes:sub((i - 1) * size + 1, i * size) end
    end
    pieces = pieces or { bytes }
    for i, p in ipairs(pieces) do
        if i > 1 and opts.pause then socket.sleep(opts.pause) end
        if p ~= "" then
            local ok, serr = conn:send(p)
            if not ok then
                -- the peer may legitimately close early (e.g. a 400): still collect what it said
                local data, closed = conn:read_all(0.5)
                conn:close()
                return data, closed or true, serr
            end
        end
    end
    if opts.shutdown then conn.sock:shutdown("send") end
    local deadline = gettime() + (opts.timeout or 3)
    local parts, closed, rerr = {}, false, nil
    local cond = opts["until"]
    for _ = 1, 1000000 do
        local data, ferr = conn.reader.fill(deadline)
        if data then
            parts[#parts + 1] = data
            if cond then
                local so_far = table.concat(parts)
                if (type(cond) == "function" and cond(so_far)) or (type(cond) == "string" and so_far:find(cond)) then
                    break
                end
            end
        else
            closed = ferr ~= "timeout"
            rerr = ferr
            break
        end
    end
    conn:close()
    return table.concat(parts), closed, rerr
end

-- Polls fn every 20 ms until it returns a truthy value or `seconds` (default 5) pass; returns that value.
function H.wait_until(fn, seconds)
    local deadline = gettime() + (seconds or 5)
    for _ = 1, math.ceil((seconds or 5) / 0.02) + 2 do
        local v = fn()
        if v then return v end
        if gettime() >= deadline then return v end
        socket.sleep(0.02)
    end
    return fn()
end

-- Runs a shell command line (or an argv table) with a timeout (default 30 s); returns exit code, combined output.
function H.run(cmd, opts)
    opts = opts or {}
    if type(cmd) == "table" then
        local q = {}
        for i, a in ipairs(cmd) do q[i] = shell_quote(a) end
        cmd = table.concat(q, " ")
    end
    local line = ("timeout -k 2 %d sh -c %s </dev/null 2>&1; echo \"__RIC_RC__=$?\""):format(
        opts.timeout or 30, shell_quote(cmd))
    local f = assert(io.popen(line, "r"))
    local out = f:read("*a")
    f:close()
    local body, code = out:match("^(.-)__RIC_RC__=(%d+)\n?$")
    if not code then return -1, out end
    return tonumber(code), body
end

---------------------------------------------------------------------------
-- Fault upstream
---------------------------------------------------------------------------

local Upstream = setmetatable({}, { __index = Proc })
Upstream.__index = Upstream

local function control(self, method, what, tbl)
    local body = tbl ~= nil and cjson.encode(tbl) or nil
    local resp, err = H.request(self.port, {
        method = method, path = "/__fault/" .. what, body = body, timeout = 10,
        headers = { { "Content-Type", "application/json" }, { "Connection", "close" } },
    })
    if not resp then error(("fault upstream %s failed: %s"):format(what, tostring(err)), 3) end
    if resp.status ~= 200 then
        error(("fault upstream %s: HTTP %d %s"):format(what, resp.status, resp.body), 3)
    end
    return cjson.decode(resp.body)
end

-- Replaces the program (see tests/tools/fault_upstream.lua for the response fields).
function Upstream:program(tbl) return control(self, "POST", "program", tbl) end
-- All recorded requests, in arrival order. opts.since = n skips hits 1..n; opts.bodies = false omits bodies.
function Upstream:hits(opts)
    local q = {}
    if opts and opts.since then q[#q + 1] = "since=" .. opts.since end
    if opts and opts.bodies == false then q[#q + 1] = "bodies=0" end
    return control(self, "GET", "hits" .. (#q > 0 and "?" .. table.concat(q, "&") or ""))
end
function Upstream:stats() return control(self, "GET", "stats") end
function Upstream:reset() return control(self, "POST", "reset") end
-- Opens the gate name: the answers programmed with hold = name go on (and later ones do not wait).
function Upstream:release(name) return control(self, "POST", "release", { name = name }) end

-- Waits until at least n requests were recorded; returns the hits (or what there was at the deadline).
function Upstream:wait_hits(n, seconds)
    H.wait_until(function() return self:stats().hits >= n end, seconds or 5)
    return self:hits()
end

function Upstream:log()
    return (read_file(self.dir .. "/stderr.log") or "") .. (self.log_cache or "")
end

function Upstream:stop()
    if self.stopped then return self.exit_code end
    local code = self:terminate(3)
    self.log_cache = read_file(self.dir .. "/stderr.log")
    self.stopped = true
    rm_rf(self.dir)
    self.dir = "/nonexistent"
    return code
end

-- Starts tests/tools/fault_upstream.lua; opts.port (default 0 = ephemeral), opts.max_seconds (default 300),
-- opts.verbose. Returns the upstream object once it printed its listening line (bounded: opts.timeout, 20 s).
function H.start_upstream(opts)
    opts = opts or {}
    local dir = mkdtemp("up")
    local argv = { os.getenv("LUAJIT") or "luajit", H.upstream_script,
        "--port", tostring(opts.port or 0), "--max-seconds", tostring(opts.max_seconds or 300) }
    if opts.verbose then argv[#argv + 1] = "--verbose" end
    local pid, err = spawn({ argv = argv, stdout = dir .. "/stdout.log", stderr = dir .. "/stderr.log" })
    if not pid then
        rm_rf(dir)
        error(err, 2)
    end
    local up = new_proc(pid, { dir = dir })
    setmetatable(up, Upstream)
    local port = H.wait_until(function()
        local out = read_file(dir .. "/stdout.log") or ""
        local p = out:match("listening [%d.]+:(%d+)\n")
        if p then return tonumber(p) end
        if not up:alive() then return -1 end
    end, opts.timeout or 20)
    if not port or port < 0 then
        local log = read_file(dir .. "/stderr.log") or ""
        up:stop()
        error("fault upstream did not start: " .. (port and "exited" or "timed out") .. "\n" .. log, 2)
    end
    up.port = port
    up.addr = LOOPBACK .. ":" .. port
    return up
end

---------------------------------------------------------------------------
-- Gateway
---------------------------------------------------------------------------

local Gateway = setmetatable({}, { __index = Proc })
Gateway.__index = Gateway

local function list_logs(prefix)
    local files = {}
    local ok, lfs = pcall(require, "lfs")
    if not ok then return files end
    local function scan(dir, depth)
        local okd, iter, state = pcall(lfs.dir, dir)
        if not okd then return end
        for name in iter, state do
            if name ~= "." and name ~= ".." then
                local path = dir .. "/" .. name
                local mode = lfs.attributes(path, "mode")
                if mode == "directory" and depth < 3 then
                    scan(path, depth + 1)
                elseif mode == "file" and name:find("%.log$") and path ~= prefix .. "/stderr.log" then
                    files[#files + 1] = path
                end
            end
        end
    end
    scan(prefix, 1)
    table.sort(files)
    return files
end

-- stderr first, then every *.log under the prefix (error_log may point anywhere inside it).
function Gateway:log()
    if self.log_cache then return self.log_cache end
    local out = { read_file(self.prefix .. "/stderr.log") or "" }
    for _, path in ipairs(list_logs(self.prefix)) do
        out[#out + 1] = ("\n== %s ==\n"):format(path:sub(#self.prefix + 2))
        out[#out + 1] = read_file(path) or ""
    end
    return table.concat(out)
end

function Gateway:url(path)
    return ("http://%s:%d%s"):format(LOOPBACK, self.port, path or "/")
end

-- SIGTERM to the master (which should stop its workers), bounded wait, then SIGKILL for master and any workers
-- still around; reaps the master. The prefix is removed afterwards unless opts.keep_prefix / RICOCHET_KEEP_TMP,
-- but :log() keeps working from a cached copy.
function Gateway:stop(grace)
    if self.stopped then return self.exit_code end
    local kids = descendants(self.pid)
    if self:alive() then
        self:signal("TERM")
        if not self:wait_exit(grace or 5) then
            for _, k in ipairs(descendants(self.pid)) do kids[#kids + 1] = k end
            kill_leftovers(kids, 9)
            self:signal("KILL")
            self:wait_exit(5)
        end
    end
    -- workers orphaned by a dying master get a moment to finish on their own, then are killed
    H.wait_until(function()
        for _, k in ipairs(kids) do
            if pid_alive(k) then return false end
        end
        return true
    end, 1)
    kill_leftovers(kids, 9)
    self.log_cache = self:log()
    self.stopped = true
    if not (self.keep_prefix or os.getenv("RICOCHET_KEEP_TMP")) then rm_rf(self.prefix) end
    -- under `make asan` a sanitizer report in any process of the gateway fails the spec
    local report = self.log_cache:match("[^\n]*Sanitizer[^\n]*") or self.log_cache:match("[^\n]*runtime error:[^\n]*")
    if report then
        error("the gateway reported a sanitizer error: " .. report .. "\n" .. self.log_cache:sub(1, 4000), 2)
    end
    return self.exit_code
end

-- The master's current worker processes (live children).
function Gateway:workers()
    return descendants(self.pid)
end

local function upstream_addr(u)
    if type(u) == "table" then return LOOPBACK .. ":" .. assert(u.port, "upstream without port") end
    if type(u) == "number" then return LOOPBACK .. ":" .. u end
    return tostring(u)
end

-- Fills {{NAME}} placeholders; unknown ones are an error so a typo doesn't reach the gateway as literal text.
local function render(conf, vars)
    local missing
    local out = conf:gsub("{{([%w_]+)}}", function(name)
        local v = vars[name]
        if v == nil then missing = missing or name; return "" end
        return tostring(v)
    end)
    if missing then error("config placeholder {{" .. missing .. "}} has no value", 3) end
    return out
end

-- Config text with the gateway's own placeholders filled in (plus extra vars).
function Gateway:render(conf, extra)
    local vars = {}
    for k, v in pairs(self.vars) do vars[k] = v end
    for k, v in pairs(extra or {}) do vars[k] = v end
    return render(conf, vars)
end

-- The listening sockets come before the pid file: a `-s` asked right after the start (which waits for a
-- listener) must first see the pid file its config names hold a running master, or it is refused as stale.
-- Waits for that (bounded, 20 s); at once when the config has no pid file.
function Gateway:wait_pid_file()
    local pid = ("\n" .. (read_file(self.conf_path) or "")):match("\n%s*pid%s+([^;%s]+)%s*;")
    if not pid or pid == "off" then return end
    if pid:sub(1, 1) ~= "/" then pid = self.prefix .. "/" .. pid end
    H.wait_until(function()
        local named = tonumber((read_file(pid) or ""):match("^(%d+)\n"))
        return named and pid_alive(named)
    end, 20)
end

-- Writes a new config for the gateway (the same placeholders, plus extra vars) and asks the
-- running master to reload it: `ricochet -s reload`, which waits for the outcome.
-- Returns its exit code and output.
function Gateway:reload(conf, extra)
    self:wait_pid_file()
    if conf then write_file(self.conf_path, self:render(conf, extra)) end
    return H.run({ self.argv[1], "-p", self.prefix, "-c", self.conf_path, "-s", "reload" },
        { timeout = 70 })
end

local function accepts(port)
    local s = socket.tcp()
    s:settimeout(0.2)
    local ok = s:connect(LOOPBACK, port)
    s:close()
    return ok ~= nil
end

-- Starts build/ricochet (or $RICOCHET_BIN) in the foreground with a fresh prefix.
-- opts.conf: config text with {{PORT}} {{PORT2}} {{UPSTREAM}} {{UPSTREAM1..n}} {{PREFIX}} placeholders;
-- opts.ports: {PORT = n, PORT2 = n} or {n1, n2}; opts.upstream: upstream object, port number or "host:port";
-- opts.upstreams: list of those; opts.vars: extra placeholders; opts.args: extra command-line arguments;
-- opts.env: environment overrides; opts.wait = false skips waiting for the listen port (e.g. startup failures);
-- opts.timeout: startup wait (default 20 s: a busy machine can be slow to start it, a fast one waits no longer); opts.keep_prefix keeps the temp dir after stop().
-- A port found free is free only until another process on the machine binds it (other test runs do): when the
-- gateway could not listen on ports this helper chose, it is started again on fresh ones (3 tries).
function H.start_gateway(opts)
    opts = opts or {}
    local given = opts.ports or opts.port
    for _ = 1, 2 do
        local ok, gw = pcall(H._start_gateway, opts)
        if ok then return gw end
        if given or opts.wait == false or not tostring(gw):find("Address already in use", 1, true) then
            error(gw, 2)
        end
    end
    return H._start_gateway(opts)
end

function H._start_gateway(opts)
    local bin = opts.bin or H.bin()
    local probe = io.open(bin, "rb")
    if probe then probe:close() else error("gateway binary not found: " .. bin .. " (build it first)", 0) end
    local prefix = mkdtemp("gw")
    local given = opts.ports or {}
    local fresh = H.free_ports(2)
    local vars = {
        PORT = given.PORT or given[1] or opts.port or fresh[1],
        PORT2 = given.PORT2 or given[2] or fresh[2],
        PREFIX = prefix,
    }
    if opts.upstream then vars.UPSTREAM = upstream_addr(opts.upstream) end
    for i, u in ipairs(opts.upstreams or {}) do
        vars["UPSTREAM" .. i] = upstream_addr(u)
        vars.UPSTREAM = vars.UPSTREAM or vars["UPSTREAM" .. i]
    end
    for k, v in pairs(opts.vars or {}) do vars[k] = v end
    local conf_path = prefix .. "/ricochet.conf"
    -- nginx-style defaults put logs and pid files under prefix/logs
    local okl, lfs = pcall(require, "lfs")
    if okl then lfs.mkdir(prefix .. "/logs") end
    write_file(conf_path, render(opts.conf or "", vars))

    local argv = { bin, "-p", prefix, "-c", conf_path }
    for _, a in ipairs(opts.args or {}) do argv[#argv + 1] = a end
    local pid, err = spawn({ argv = argv, stdout = prefix .. "/stdout.log", stderr = prefix .. "/stderr.log",
        env = opts.env })
    if not pid then
        rm_rf(prefix)
        error(err, 0)
    end
    local gw = new_proc(pid, {
        prefix = prefix, conf_path = conf_path, vars = vars, argv = argv, keep_prefix = opts.keep_prefix,
        port = tonumber(vars.PORT), port2 = tonumber(vars.PORT2),
    })
    setmetatable(gw, Gateway)
    if opts.wait == false then return gw end

    -- the listeners accept as soon as the config is read, before the master writes its pid file and
    -- forks its workers: ready is both, so a `-s reload` right after start finds the master
    local ready = H.wait_until(function()
        if not gw:alive() then return "exited" end
        if accepts(gw.port) and #gw:workers() > 0 then return "ready" end
    end, opts.timeout or 20)
    if ready ~= "ready" then
        local code = gw.exit_code
        local log = gw:log()
        gw:stop()
        error(("gateway %s (status %s); log:\n%s"):format(
            ready == "exited" and "exited during startup" or "did not accept connections in time",
            tostring(code), log), 0)
    end
    return gw
end

-- Starts any program (argv) with its output in log_path; opts.port: wait (bounded, 20 s) until it accepts there.
-- Returns a process object (:stop(), :alive(), :signal()); it is killed at exit if a test forgets it.
function H.start_process(argv, log_path, opts)
    opts = opts or {}
    local pid, err = spawn({ argv = argv, stdout = log_path, stderr = "stdout" })
    if not pid then error(err, 2) end
    local p = new_proc(pid, {})
    p.stop = function(self) return self:terminate(3) end
    if opts.port then
        local up = H.wait_until(function()
            if not p:alive() then return "exited" end
            if accepts(opts.port) then return "ready" end
        end, 20)
        if up ~= "ready" then
            p:terminate(2)
            error(argv[1] .. " did not start: " .. tostring(up) .. "\n" .. (read_file(log_path) or ""), 2)
        end
    end
    return p
end

---------------------------------------------------------------------------
-- Redis: a private redis-server on an ephemeral loopback port
---------------------------------------------------------------------------

local Redis = setmetatable({}, { __index = Proc })
Redis.__index = Redis

local function redis_spawn(r)
    local argv = { os.getenv("REDIS_SERVER") or "redis-server", "--port", tostring(r.port),
        "--bind", LOOPBACK, "--save", "", "--appendonly", "no", "--dir", r.dir, "--daemonize", "no",
        "--protected-mode", "no" }
    for _, a in ipairs(r.args or {}) do argv[#argv + 1] = a end
    local pid, err = spawn({ argv = argv, stdout = r.dir .. "/redis.log", stderr = "stdout" })
    if not pid then error(err, 3) end
    r.pid, r.exit_code = pid, nil
    live_procs[r] = true
    local up = H.wait_until(function()
        if not r:alive() then return "exited" end
        if accepts(r.port) then return "ready" end
    end, 20)
    if up ~= "ready" then
        local log = read_file(r.dir .. "/redis.log") or ""
        r:terminate(2)
        error("redis-server did not start: " .. tostring(up) .. "\n" .. log, 3)
    end
end

-- Starts redis-server (opts.port: default a free one; opts.args: more of its options); :stop() ends it, :restart() stops it and starts it again
-- on the same port (its data is gone: nothing is saved), :command(...) sends one command and returns the reply
-- line(s) as a string.
function H.start_redis(opts)
    opts = opts or {}
    local r = setmetatable({ dir = mkdtemp("redis"), port = opts.port or H.free_port(), args = opts.args }, Redis)
    redis_spawn(r)
    r.addr = LOOPBACK .. ":" .. r.port
    return r
end

function Redis:restart()
    self:terminate(3)
    redis_spawn(self)
end

function Redis:stop()
    if self.stopped then return end
    self:terminate(3)
    self.stopped = true
    rm_rf(self.dir)
end

-- One RESP command; the raw reply, read until it is whole enough for a test (bounded by a 2 s timeout).
function Redis:command(...)
    local args = { ... }
    local out = { "*" .. #args .. "\r\n" }
    for _, a in ipairs(args) do
        a = tostring(a)
        out[#out + 1] = "$" .. #a .. "\r\n" .. a .. "\r\n"
    end
    local s = socket.tcp()
    s:settimeout(2)
    assert(s:connect(LOOPBACK, self.port))
    assert(s:send(table.concat(out)))
    local line = s:receive("*l")
    local reply = line
    if line and line:sub(1, 1) == "*" then
        local parts = {}
        for _ = 1, tonumber(line:sub(2)) or 0 do
            local len = s:receive("*l")
            parts[#parts + 1] = len and s:receive("*l") or nil
        end
        reply = parts
    elseif line and line:sub(1, 1) == "$" and tonumber(line:sub(2)) >= 0 then
        reply = s:receive(tonumber(line:sub(2)) + 2)
    end
    s:close()
    return reply
end

-- The gateway's access log as decoded entries, whole lines only (a line being written is left for the
-- next look); with path, only the entries of requests to it.
function H.access_entries(gw, path)
    local out = {}
    for line in (H.read_file(gw.prefix .. "/logs/access.log") or ""):gmatch("([^\n]+)\n") do
        local ok, e = pcall(H.json.decode, line)
        if ok and type(e) == "table" and (path == nil or e.path == path) then out[#out + 1] = e end
    end
    return out
end

-- Sends reqs (tables for H.build_request) each on a fresh connection with Connection: close, `width` at a time,
-- so the kernel hands them to either worker; returns the responses in order (false for a failure) and the first error.
function H.fire(port, reqs, width)
    local out, first_err = {}, nil
    for start = 1, #reqs, width do
        local conns = {}
        for i = start, math.min(start + width - 1, #reqs) do
            local req = {}
            for k, v in pairs(reqs[i]) do req[k] = v end
            local headers = { { "Connection", "close" } }
            for _, h in ipairs(reqs[i].headers or {}) do headers[#headers + 1] = h end
            req.headers = headers
            local c, err = H.connect(port)
            if c then
                local ok, serr = c:send(H.build_request(port, req))
                if not ok then err = serr; c:close(); c = nil end
            end
            conns[i] = c or false
            first_err = first_err or (not c and err) or nil
        end
        for i = start, math.min(start + width - 1, #reqs) do
            local c = conns[i]
            out[i] = false
            if c then
                local resp, err = c:read_response({ timeout = 10, method = reqs[i].method })
                out[i] = resp or false
                first_err = first_err or (not resp and err) or nil
                c:close()
            end
        end
    end
    return out, first_err
end

-- The access log entries whose path starts with prefix (whole lines only).
function H.entries(gw, prefix)
    local out = {}
    for _, e in ipairs(H.access_entries(gw)) do
        if type(e.path) == "string" and e.path:sub(1, #prefix) == prefix then out[#out + 1] = e end
    end
    return out
end

return H
