-- ricochet/sandbox.lua: how a route script is loaded: its own environment, a narrow require, no bytecode.
--
-- The gateway and the test kit (ricochet.testing) both load scripts through this file, so a script sees
-- the same world offline as in production. It returns
--   prepare(path, ricochet, bundled_dir, sources, json) -> the script's main chunk, ready to run (the
--                                           caller runs it, bounded), or nil and "path:line: reason"; sources
--                                           (file -> text) is read before the disk and keeps what was read,
--                                           so a state made again runs the text it first ran; json (optional:
--                                           { cjson = M, ["cjson.safe"] = M }) is where the script's own
--                                           instances come from (M.new()), the loaded cjson by default;
--   check(path, route)                   -> route, or nil and a reason: what the chunk returned must be
--                                           a table of hooks;
--   unwind()                             -> after a call that failed: its bookkeeping put back (below).
local jit = rawget(_G, "jit")

local function copy(t)
    local c = {}
    for k, v in pairs(t) do c[k] = v end
    return c
end

-- Reads path as Lua source text (never bytecode), from sources when it has it; returns the chunk with env
-- as its environment.
local function load_source(path, env, sources)
    local src = sources[path]
    if not src then
        local f, err = io.open(path, "rb")
        if not f then return nil, ("cannot open %s"):format(err or path) end
        src = f:read("*a")
        f:close()
        sources[path] = src
    end
    if src:byte(1) == 27 then
        return nil, path .. ": precompiled bytecode is not loaded, only Lua source"
    end
    local chunk, lerr = loadstring(src, "@" .. path)
    if not chunk then return nil, lerr end
    setfenv(chunk, env)
    -- compiled traces never check the instruction-count hook that bounds a hook's run time: script code
    -- stays in the interpreter, so a loop in it is always stopped (the library it calls is compiled)
    if jit then jit.off(chunk, true) end
    return chunk
end

-- --- bounds that hold whatever a script does ----------------------------------------------------------
-- The gateway stops a hook that runs too long by raising STOPPED from its instruction-count hook; an
-- error handler of an error raised there runs with that hook off, so no script handler may ever run for
-- it: pcall and xpcall pass it straight on. Library functions that call back into Lua (gsub, sort,
-- tostring, format) nest C frames on the C stack: their depth is bounded with a Lua error. After a
-- library call that can run long, guard() (the gateway's clock check; nothing in the test kit) stops a
-- hook past its bound at once, not 1,000 instructions later.
--
-- What is in flight (depth, the callbacks nested now; loading, the modules whose main chunk runs now) is
-- counted back on the way out of each call, but a stopped call never gets there: once stopped, every
-- instruction raises again, so the code after a pcall does not run. unwind() puts both back to nothing
-- in flight; the caller of a hook runs it after every call that failed (a call that returned ran every
-- way out). Both are one per Lua state, whichever copy of this file counts (busted loads it again for
-- each spec file, while the strings' functions stay the first copy's), kept where no script reaches them.
local STOPPED = "stopped: it ran longer than a hook may"
local MAX_DEPTH = 50
local guard = function() end
local registry = debug.getregistry()
local inflight = registry.ricochet_inflight or { depth = 0, loading = {} }
registry.ricochet_inflight = inflight
local loading = inflight.loading
local raw_pcall, raw_xpcall, raw_error, select, unpack = pcall, xpcall, error, select, unpack

-- a stop, or an allocation the state's bound refused: the call is over, whatever catches it
local function stopped(e)
    return type(e) == "string" and (e:find(STOPPED, 1, true) ~= nil or e == "not enough memory")
end

-- pcall's results, with a stop passed on
local function passed(ok, ...)
    if not ok and stopped((...)) then raw_error((...), 0) end
    return ok, ...
end

local function safe_pcall(f, ...)
    return passed(raw_pcall(f, ...))
end

local function safe_xpcall(f, handler)
    return passed(raw_xpcall(f, function(e)
        if stopped(e) then return e end
        return handler(e)
    end))
end

local function left(ok, ...)
    inflight.depth = inflight.depth - 1
    guard()
    if not ok then raw_error((...), 0) end
    return ...
end

-- fn with its callbacks' nesting bounded, and the clock checked after it
local function bounded(fn, name)
    return function(...)
        local depth = inflight.depth
        if depth >= MAX_DEPTH then
            -- no format here: it is one of the bounded functions, past its depth too
            raw_error(name .. ": callbacks nested more than " .. MAX_DEPTH .. " deep", 2)
        end
        inflight.depth = depth + 1
        return left(raw_pcall(fn, ...))
    end
end

local function after(...)
    guard()
    return ...
end

-- fn, with the clock checked after it (a long scan of a long string)
local function timed(fn)
    return function(...)
        return after(fn(...))
    end
end

local real_rep = string.rep
local function bounded_rep(s, n, sep)
    -- the size first, with the coercions rep itself makes (a number is a string here)
    local len = #tostring(s) + #(sep ~= nil and tostring(sep) or "")
    local count = tonumber(n) or 0
    if len * count > 16777216 then
        raw_error("string.rep: a result over 16 MiB", 2)
    end
    return real_rep(s, n, sep)
end

-- The gateway's own pattern functions (core/script_match.c): LuaJIT's backtrack in C for as long as a
-- pattern takes (minutes for ".-.-.-.-.-.-b" on 300 bytes), these read the hook's deadline at every
-- step. They give LuaJIT's results, so the test kit, which bounds no time, keeps LuaJIT's own.
local patterns = package.loaded["ricochet.patterns"] or {}

-- The strings' metatable reaches the real string table from any script ("x"):gsub(...): the bounded
-- functions go there too, once, for the gateway's state and the test kit alike.
if not string.__ricochet_bounded then
    string.gsub = bounded(patterns.gsub or string.gsub, "string.gsub")
    string.format = bounded(string.format, "string.format")
    string.rep = bounded_rep
    for _, name in ipairs({ "find", "match", "gmatch", "lower", "upper", "reverse", "sub", "byte" }) do
        string[name] = timed(patterns[name] or string[name])
    end
    string.dump = nil
    rawset(string, "__ricochet_bounded", true)
end

-- table.sort without a comparator compares in C, where no hook can stop it (n log n comparisons of long
-- strings with one prefix, or n^2 of them on an order that defeats its quicksort): it compares through
-- this Lua function instead, so a hook can be stopped between any two comparisons.
local raw_sort = table.sort
local function less(a, b)
    return a < b
end
local function sort(t, comp)
    if comp == nil then comp = less end
    return raw_sort(t, comp)
end

local safe_string = copy(string)
safe_string.__ricochet_bounded = nil
local safe_table = copy(table)
safe_table.sort = bounded(sort, "table.sort")
safe_table.concat = timed(table.concat)
safe_table.foreach, safe_table.foreachi = nil, nil
local safe_tostring = bounded(tostring, "tostring")

-- os.date hands its whole format to one strftime, which no hook interrupts, and glibc's %s reads the
-- time zone file at each one (a million of them held a worker for seconds): a format is at most 256 bytes.
local real_date = os.date
local function safe_date(format, time)
    if type(format) == "string" and #format > 256 then
        raw_error("os.date: a format is at most 256 bytes", 2)
    end
    return real_date(format, time)
end

-- The gateway's objects (req, res, attempt) are read-only but for their writable fields: rawset, which
-- would pass their guard, refuses them.
local raw_rawset, raw_getmetatable = rawset, getmetatable
local function safe_rawset(t, k, v)
    local mt = raw_getmetatable(t)
    if type(mt) == "string" and mt:find("^ricochet%.") then
        raw_error(("rawset: %s is the gateway's"):format(mt:sub(10)), 2)
    end
    return raw_rawset(t, k, v)
end

local HOOKS = { on_request = true, classify = true, on_log = true, on_response = true }

local function check(path, route)
    if type(route) ~= "table" then
        return nil, ("%s: the script must return a table of hooks (on_request, classify, on_response, on_log), "
            .. "not a %s"):format(path, type(route))
    end
    for k, v in pairs(route) do
        if not HOOKS[k] then
            return nil, ('%s: the table returned has "%s", which is no hook (they are on_request, '
                .. "classify, on_response and on_log)"):format(path, tostring(k))
        end
        if type(v) ~= "function" then
            return nil, ("%s: route.%s must be a function, not a %s"):format(path, k, type(v))
        end
    end
    return route
end

local function prepare(path, ricochet, bundled_dir, sources, json)
    sources = sources or {}
    json = json or { cjson = require("cjson"), ["cjson.safe"] = require("cjson.safe") }
    local dir = path:match("^(.*)/[^/]*$") or "."
    local env = {
        assert = assert, error = error, ipairs = ipairs, next = next, pairs = pairs, pcall = safe_pcall,
        select = select, tonumber = tonumber, tostring = safe_tostring, type = type, unpack = unpack,
        xpcall = safe_xpcall, setmetatable = setmetatable, rawget = rawget, rawset = safe_rawset,
        rawequal = rawequal, _VERSION = _VERSION,
        getmetatable = function(v)
            if type(v) == "string" then return nil end -- the strings' metatable is everyone's
            return getmetatable(v)
        end,
        -- every library table is the script's own copy: what one script changes, no other sees
        string = copy(safe_string), table = copy(safe_table), math = copy(math), bit = copy(require("bit")),
        os = { time = os.time, clock = os.clock, date = safe_date, difftime = os.difftime },
        ricochet = copy(ricochet),
    }
    env._G = env
    local loaded = {
        -- instances of the script's own: what it configures (decode_max_depth...) no one else sees
        cjson = json.cjson.new(), ["cjson.safe"] = json["cjson.safe"].new(), ricochet = env.ricochet,
        string = env.string, table = env.table, math = env.math, bit = env.bit, os = env.os,
    }
    env.require = function(name)
        if type(name) ~= "string" or not name:match("^[%w_]+[%w_.]*$") or name:find("%.%.") then
            error(("require: invalid module name %q"):format(tostring(name)), 2)
        end
        if loaded[name] ~= nil then return loaded[name] end
        local rel = name:gsub("%.", "/") .. ".lua"
        local candidates = { dir .. "/" .. rel }
        if name:match("^ricochet%.") and bundled_dir then
            candidates[#candidates + 1] = bundled_dir .. "/" .. rel:gsub("^ricochet/", "")
        end
        for _, file in ipairs(candidates) do
            local f = not sources[file] and io.open(file, "rb")
            if f then f:close() end
            if sources[file] or f then
                -- by file: one script's modules never load while another script's do
                if loading[file] then error(("require: %q requires itself"):format(name), 2) end
                local chunk, err = load_source(file, env, sources)
                if not chunk then error(err, 2) end
                loading[file] = true
                local ok, v = pcall(chunk, name)
                loading[file] = nil
                if not ok then error(v, 0) end
                if v == nil then v = true end
                loaded[name] = v
                return v
            end
        end
        error(("require: module %q not found (looked in %s; only the script's directory and the "
            .. "bundled ricochet.* modules)"):format(name, table.concat(candidates, ", ")), 2)
    end
    return load_source(path, env, sources)
end

-- The gateway's clock check, run after long library calls (it raises STOPPED past the hook's bound).
local function set_guard(fn)
    guard = fn
end

-- Nothing in flight any more: the state as before the call that failed, whatever way it ended. It
-- allocates nothing, so it cannot fail when the memory bound has just refused an allocation.
local function unwind()
    inflight.depth = 0
    local file = next(loading)
    while file ~= nil do
        loading[file] = nil
        file = next(loading)
    end
end

return { prepare = prepare, check = check, set_guard = set_guard, unwind = unwind, STOPPED = STOPPED }
