-- wrk -t1 -cN -dDs --latency -s bench/post.lua URL
-- POSTs the file named by env BODY as JSON. Env AUTH_KEY sets the bearer key (default sk-bench);
-- env HEADERS adds headers, one "Name: value" per line (e.g. "X-Session-Id: bench-images").
local file = assert(io.open(os.getenv("BODY"), "rb"))
local payload = file:read("*a")
file:close()

wrk.method = "POST"
wrk.body = payload
wrk.headers["Content-Type"] = "application/json"
wrk.headers["Authorization"] = "Bearer " .. (os.getenv("AUTH_KEY") or "sk-bench")
for line in (os.getenv("HEADERS") or ""):gmatch("[^\n]+") do
  local name, value = line:match("^%s*([^:]+):%s*(.-)%s*$")
  if name then
    wrk.headers[name] = value
  end
end
