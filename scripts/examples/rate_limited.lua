-- rate_limited.lua: an API that answers 429 when over its rate, saying when to come back in Retry-After
-- (seconds or a date) or in X-RateLimit-Reset (a Unix time). The retry waits exactly that long; the
-- gateway never waits past the request's deadline, so a reset too far away gives the client the 429.
local route = {}

function route.classify(res, attempt)
    if res == nil or res.status ~= 429 then return nil end
    local wait = res:retry_after()
    if wait == nil then
        local reset = tonumber(res:header("X-RateLimit-Reset"))
        if reset then wait = math.max(0, reset - ricochet.now()) end
    end
    if wait ~= nil then return "retry", wait end
    return "retry" -- no hint: the backoff decides
end

return route
