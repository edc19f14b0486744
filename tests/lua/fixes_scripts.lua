-- tests/lua/fixes_scripts.lua: route scripts that the kit's specs and the gateway's run alike (issue 33), with
-- what both must answer.
-- A script that sets a shared value with the ttl its query names, and says what happened (the gateway's
-- tests/e2e/script_api_fixes_spec.lua runs the same text and expects the same words).
local F = {}
F.TTL_SCRIPT = [[
local d = ricochet.shared("ttl")
local TTL = { zero = 0, tiny = 0.0004, neg = -1, inf = math.huge, nan = 0 / 0, str = "5", big = 2e9 }
return { on_request = function(req)
    local a = req:args()
    if a.set then
        local ok, err = pcall(d.set, d, a.set, "v", TTL[a.set])
        req:respond(200, { ["X-Set"] = ok and "ok" or (tostring(err):gsub("^.-:%d+: ", "")) }, "")
    else
        req:respond(200, { ["X-Get"] = tostring(d:get(a.get)) }, "")
    end
end }
]]
local REFUSED = "a shared value's ttl is a number of seconds from 0 to 1e9 (0 or none: for ever), not "
F.TTL_WANT = { none = "ok", zero = "ok", tiny = "ok", neg = REFUSED .. "-1", inf = REFUSED .. "inf",
    nan = REFUSED .. "nan", str = REFUSED .. "a string", big = REFUSED .. "2000000000" }

-- An on_log that keeps its ctx and calls the kept one's :set in the next request's on_log.
F.KEPT_SCRIPT = [[
local kept
return { on_log = function(ctx)
    if ctx.path == "/keep" then
        kept = ctx
        ctx:set("mine", "a")
    elseif kept then
        local ok, err = pcall(kept.set, kept, "leak", "x")
        ctx:set("kept_refused", not ok)
        ctx:set("kept_error", (tostring(err):gsub("^.-:%d+: ", "")))
    end
end }
]]

return F
