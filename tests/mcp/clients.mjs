#!/usr/bin/env node
// Real MCP client libraries driven against an MCP endpoint, for the Rust integration tests.
//
//   node clients.mjs <scenario> <url>
//
// Scenarios:
//   mastra                 @mastra/mcp MCPClient (Mastra's default negotiation unless
//                          AIRLOCK_MCP_NEGOTIATION is set); lists tools, runs the calls.
//   sdk-legacy             @modelcontextprotocol/sdk 1.x Client: initialize (2025-11-25).
//   sdk-legacy-2025-06-18  @modelcontextprotocol/client 2.x Client, legacy era, offering only
//                          2025-06-18 in initialize (a genuine 2025-06-18 client).
//   sdk-2026               @modelcontextprotocol/client 2.x Client pinned to 2026-07-28
//                          (server/discover, per-request _meta, MRTR auto-fulfilment).
//
// Environment:
//   AIRLOCK_SERVICE_TOKEN    sent as "Authorization: Bearer <token>" (omitted when unset)
//   AIRLOCK_OPERATOR_TOKEN   sent as "X-Operator-Token: <token>" (omitted when unset)
//   AIRLOCK_MCP_CALLS        JSON array of {"name", "arguments"} to call in order
//                            (default: [] for the sdk scenarios; mastra: list_accounts {})
//   AIRLOCK_MCP_NEGOTIATION  mastra: unset (Mastra default = legacy initialize) | auto | 2026-07-28
//                            sdk-2026: 2026-07-28 (default, pin, no fallback) | auto
//   AIRLOCK_MCP_ELICITATION  capabilities to declare: url (default: {form:{},url:{}}),
//                            form ({form:{}}), empty ({} = form only, 2025-06-18 style),
//                            none (no elicitation capability). Default for
//                            sdk-legacy-2025-06-18 is "empty".
//   AIRLOCK_MCP_ELICIT_ACTION   answer to every elicitation: accept (default) | decline | cancel
//   AIRLOCK_MCP_ELICIT_CONTENT  JSON object sent as content when accepting a form elicitation ({})
//   AIRLOCK_MCP_ELICIT_NOTIFY_FILE  when set, one JSON line per elicitation received
//                            ({scenario, source, mode, url, message, elicitationId, ...}) is
//                            appended to this file before answering.
//   AIRLOCK_MCP_ELICIT_WAIT_FILE    when set, before answering an elicitation the client waits
//                            until this file exists, then deletes it (so the test can, e.g.,
//                            approve the plan and then release the client). Waits at most
//                            AIRLOCK_MCP_ELICIT_WAIT_MS (default 30000) then answers anyway
//                            (recorded as waitTimedOut).
//   AIRLOCK_MCP_MAX_ROUNDS   retries after an input-required result / -32042 error (default 3).
//                            sdk-2026: 0 = hand the raw input_required result back
//                            (allowInputRequired), no retry. mastra: not configurable (Mastra
//                            uses the SDK default of 10 input_required rounds and never retries
//                            a -32042 error).
//   AIRLOCK_MCP_TIMEOUT_MS   per-request timeout (default 20000)
//   AIRLOCK_MCP_DEADLINE_MS  whole-run watchdog; on expiry prints what it has with
//                            "timedOut": true and exits 0 (default 90000)
//
// Output: exactly ONE JSON object on stdout (everything the libraries log goes to stderr).
// Exit status: 0 whenever the run completed or timed out (protocol errors, HTTP errors and
// failed connects are observations, recorded in the JSON); 1 on an unexpected crash of this
// script or a library outside the recorded stages; 2 on bad usage.

import { readFileSync, appendFileSync, existsSync, unlinkSync } from 'node:fs';

// ---- stdout discipline: only the final JSON goes to the real stdout --------------------------
const realStdoutWrite = process.stdout.write.bind(process.stdout);
process.stdout.write = (chunk, encoding, cb) => process.stderr.write(chunk, encoding, cb);
for (const level of ['log', 'info', 'debug']) console[level] = (...args) => console.error(...args);

const SCENARIOS = ['mastra', 'sdk-legacy', 'sdk-legacy-2025-06-18', 'sdk-2026'];
const [scenario, targetUrl] = process.argv.slice(2);
if (!SCENARIOS.includes(scenario) || !targetUrl) {
  process.stderr.write(`usage: node clients.mjs <${SCENARIOS.join('|')}> <url>\n`);
  process.exit(2);
}

const env = process.env;
const timeoutMs = intEnv('AIRLOCK_MCP_TIMEOUT_MS', 20000);
const deadlineMs = intEnv('AIRLOCK_MCP_DEADLINE_MS', 90000);
const maxRounds = intEnv('AIRLOCK_MCP_MAX_ROUNDS', 3);
const elicitAction = env.AIRLOCK_MCP_ELICIT_ACTION || 'accept';
const elicitContent = env.AIRLOCK_MCP_ELICIT_CONTENT ? JSON.parse(env.AIRLOCK_MCP_ELICIT_CONTENT) : {};
const elicitationMode =
  env.AIRLOCK_MCP_ELICITATION || (scenario === 'sdk-legacy-2025-06-18' ? 'empty' : 'url');
const negotiation = env.AIRLOCK_MCP_NEGOTIATION || '';
const calls = env.AIRLOCK_MCP_CALLS
  ? JSON.parse(env.AIRLOCK_MCP_CALLS)
  : scenario === 'mastra'
    ? [{ name: 'list_accounts', arguments: {} }]
    : [];
if (!Array.isArray(calls)) {
  process.stderr.write('AIRLOCK_MCP_CALLS must be a JSON array of {name, arguments}\n');
  process.exit(2);
}
if (!['accept', 'decline', 'cancel'].includes(elicitAction)) {
  process.stderr.write('AIRLOCK_MCP_ELICIT_ACTION must be accept, decline or cancel\n');
  process.exit(2);
}

const authHeaders = {};
if (env.AIRLOCK_SERVICE_TOKEN) authHeaders.Authorization = `Bearer ${env.AIRLOCK_SERVICE_TOKEN}`;
if (env.AIRLOCK_OPERATOR_TOKEN) authHeaders['X-Operator-Token'] = env.AIRLOCK_OPERATOR_TOKEN;

const out = {
  scenario,
  url: targetUrl,
  library: null,
  ok: false, // true when every stage ran without an error
  timedOut: false,
  capabilitiesDeclared: elicitationCapabilities(),
  connect: null, // {ok, error?, ...what the library negotiated}
  tools: null, // list of tool descriptions as the library exposes them
  calls: [], // one entry per call: {name, arguments, ok, result?, error?, rounds?}
  elicitations: [], // every elicitation the client saw (input_required or -32042)
  close: null,
  http: [], // every HTTP exchange: request/response with parsed bodies
  wire: [], // compact view of `http`
};

// ---- helpers ----------------------------------------------------------------------------------
function intEnv(name, dflt) {
  const v = env[name];
  if (v === undefined || v === '') return dflt;
  const n = Number(v);
  if (!Number.isInteger(n) || n < 0) {
    process.stderr.write(`${name} must be a non-negative integer\n`);
    process.exit(2);
  }
  return n;
}

function elicitationCapabilities() {
  switch (elicitationMode) {
    case 'url':
      return { elicitation: { form: {}, url: {} } };
    case 'form':
      return { elicitation: { form: {} } };
    case 'empty':
      return { elicitation: {} };
    case 'none':
      return {};
    default:
      process.stderr.write('AIRLOCK_MCP_ELICITATION must be url, form, empty or none\n');
      process.exit(2);
  }
}

function pkgVersion(name) {
  // read node_modules/<name>/package.json next to this script (exports maps may hide it)
  try {
    const file = new URL(`./node_modules/${name}/package.json`, import.meta.url);
    return JSON.parse(readFileSync(file, 'utf8')).version;
  } catch {
    return null;
  }
}

function toJson(value, depth = 0) {
  // JSON-safe deep copy (drops functions, handles cycles/BigInt/Errors)
  const seen = new WeakSet();
  const walk = (v, d) => {
    if (v === null || typeof v === 'string' || typeof v === 'number' || typeof v === 'boolean') return v;
    if (typeof v === 'bigint') return v.toString();
    if (typeof v === 'undefined' || typeof v === 'function' || typeof v === 'symbol') return undefined;
    if (v instanceof Error) return serializeError(v, d);
    if (v instanceof URL) return v.toString();
    if (typeof v === 'object') {
      if (seen.has(v)) return '[circular]';
      if (d > 40) return '[too deep]';
      seen.add(v);
      if (Array.isArray(v)) return v.map((x) => {
        const r = walk(x, d + 1);
        return r === undefined ? null : r;
      });
      const o = {};
      for (const [k, x] of Object.entries(v)) {
        const r = walk(x, d + 1);
        if (r !== undefined) o[k] = r;
      }
      return o;
    }
    return String(v);
  };
  return walk(value, depth);
}

function serializeError(e, depth = 0) {
  if (!(e instanceof Error)) return { message: String(e), value: toJson(e) };
  const o = { name: e.name, constructor: e.constructor?.name, message: e.message };
  for (const k of ['code', 'data', 'status', 'statusCode', 'id', 'domain', 'category', 'details', 'elicitations']) {
    let v;
    try {
      v = e[k];
    } catch {
      continue;
    }
    if (v !== undefined) o[k] = toJson(v, depth + 1);
  }
  if (e.cause !== undefined && depth < 4) o.cause = e.cause instanceof Error ? serializeError(e.cause, depth + 1) : toJson(e.cause);
  return o;
}

function parseBody(text) {
  if (text === undefined || text === null) return null;
  if (text === '') return '';
  try {
    return JSON.parse(text);
  } catch {
    // SSE: collect the JSON of every data: line
    if (/^(event|data|id|retry):|^:/m.test(text)) {
      const events = [];
      for (const block of text.split(/\r?\n\r?\n/)) {
        const data = block
          .split(/\r?\n/)
          .filter((l) => l.startsWith('data:'))
          .map((l) => l.slice(5).replace(/^ /, ''))
          .join('\n');
        if (!data) continue;
        try {
          events.push(JSON.parse(data));
        } catch {
          events.push(data);
        }
      }
      return { sse: events };
    }
    return text;
  }
}

const REDACT = new Set(['authorization', 'x-operator-token', 'cookie']);
function headersObject(h) {
  const o = {};
  if (!h) return o;
  const entries = h instanceof Headers ? [...h.entries()] : Array.isArray(h) ? h : Object.entries(h);
  for (const [k, v] of entries) {
    const key = k.toLowerCase();
    o[key] = REDACT.has(key) ? `<redacted ${String(v).length} chars>` : String(v);
  }
  return o;
}

// fetch wrapper recording every exchange; never changes what is sent
const pendingBodies = new Set();
function tracingFetch(inner = globalThis.fetch) {
  return async (input, init = {}) => {
    const url = typeof input === 'string' ? input : input instanceof URL ? input.toString() : input.url;
    const method = init.method || (input instanceof Request ? input.method : 'GET');
    const entry = {
      seq: out.http.length,
      method,
      url,
      requestHeaders: headersObject(init.headers ?? (input instanceof Request ? input.headers : undefined)),
      requestBody: typeof init.body === 'string' ? parseBody(init.body) : init.body ? '<non-string body>' : null,
    };
    out.http.push(entry);
    let res;
    try {
      res = await inner(input, init);
    } catch (e) {
      entry.fetchError = serializeError(e);
      throw e;
    }
    entry.status = res.status;
    entry.responseHeaders = headersObject(res.headers);
    entry.responseBody = '<pending>';
    if (method !== 'GET' || !(res.headers.get('content-type') || '').includes('text/event-stream')) {
      const p = res
        .clone()
        .text()
        .then((t) => (entry.responseBody = parseBody(t)))
        .catch((e) => (entry.responseBody = { readError: String(e) }))
        .finally(() => pendingBodies.delete(p));
      pendingBodies.add(p);
    } else {
      entry.responseBody = '<long-lived GET event stream, not read>';
    }
    return res;
  };
}

function wireSummary() {
  return out.http.map((e) => {
    const rb = e.requestBody && typeof e.requestBody === 'object' ? e.requestBody : {};
    let resp = e.responseBody;
    if (resp && typeof resp === 'object' && Array.isArray(resp.sse)) {
      resp = resp.sse.find((m) => m && typeof m === 'object' && ('result' in m || 'error' in m)) ?? null;
    }
    const r = resp && typeof resp === 'object' ? resp : {};
    return {
      seq: e.seq,
      httpMethod: e.method,
      rpcMethod: rb.method ?? null,
      rpcId: rb.id ?? null,
      name: rb.params?.name ?? null,
      status: e.status ?? null,
      contentType: e.responseHeaders?.['content-type'] ?? null,
      protocolVersionHeader: e.requestHeaders['mcp-protocol-version'] ?? null,
      mcpMethodHeader: e.requestHeaders['mcp-method'] ?? null,
      mcpNameHeader: e.requestHeaders['mcp-name'] ?? null,
      sessionIdSent: e.requestHeaders['mcp-session-id'] ?? null,
      sessionIdReceived: e.responseHeaders?.['mcp-session-id'] ?? null,
      metaProtocolVersion: rb.params?._meta?.['io.modelcontextprotocol/protocolVersion'] ?? null,
      hasInputResponses: rb.params?.inputResponses !== undefined,
      hasRequestState: rb.params?.requestState !== undefined,
      resultType: r.result ? (r.result.resultType ?? null) : null,
      errorCode: r.error?.code ?? null,
      fetchError: e.fetchError?.message ?? null,
    };
  });
}

function sleep(ms) {
  return new Promise((r) => setTimeout(r, ms));
}

// Called for every elicitation the client receives (any library, any era).
async function onElicitation(source, params) {
  const rec = {
    source, // 'input_required' | 'url_elicitation_required_error' | 'elicitation/create request'
    mode: params?.mode ?? 'form',
    message: params?.message ?? null,
    url: params?.url ?? null,
    elicitationId: params?.elicitationId ?? null,
    requestedSchema: params?.requestedSchema ?? null,
    answeredWith: elicitAction,
  };
  out.elicitations.push(rec);
  if (env.AIRLOCK_MCP_ELICIT_NOTIFY_FILE) {
    appendFileSync(env.AIRLOCK_MCP_ELICIT_NOTIFY_FILE, JSON.stringify({ scenario, ...rec }) + '\n');
  }
  if (env.AIRLOCK_MCP_ELICIT_WAIT_FILE) {
    const file = env.AIRLOCK_MCP_ELICIT_WAIT_FILE;
    const until = Date.now() + intEnv('AIRLOCK_MCP_ELICIT_WAIT_MS', 30000);
    while (!existsSync(file) && Date.now() < until) await sleep(50);
    if (existsSync(file)) {
      try {
        unlinkSync(file);
      } catch {}
      rec.waited = true;
    } else {
      rec.waitTimedOut = true;
    }
  }
  if (elicitAction !== 'accept') return { action: elicitAction };
  return rec.mode === 'url' ? { action: 'accept' } : { action: 'accept', content: elicitContent };
}

async function stage(name, fn) {
  try {
    const value = await fn();
    return { ok: true, ...value };
  } catch (e) {
    return { ok: false, error: serializeError(e) };
  }
}

// ---- scenarios --------------------------------------------------------------------------------
async function runMastra() {
  const { MCPClient } = await import('@mastra/mcp');
  out.library = {
    name: '@mastra/mcp',
    version: pkgVersion('@mastra/mcp'),
    core: pkgVersion('@mastra/core'),
    sdk: 'bundled @modelcontextprotocol/client (see package-lock)',
  };
  const server = {
    url: new URL(targetUrl),
    requestInit: { headers: { ...authHeaders } },
    fetch: tracingFetch(),
    capabilities: elicitationCapabilities(),
    timeout: timeoutMs,
    connectTimeout: timeoutMs,
    enableServerLogs: false,
  };
  if (negotiation) server.protocolVersion = negotiation;
  const mcp = new MCPClient({ id: `airlock-test-${process.pid}`, servers: { airlock: server }, timeout: timeoutMs });
  try {
    // Mastra swallows per-server connect failures in listTools()/listToolDefinitions();
    // the *WithErrors variants report them (errors: {server: message}, errorDetails).
    out.connect = await stage('connect', async () => {
      await mcp.elicitation.onRequest('airlock', (req) => onElicitation('elicitation handler', req));
      const { definitions, errors, errorDetails } = await mcp.listToolDefinitionsWithErrors();
      if (errors?.airlock !== undefined) {
        const err = new Error(errors.airlock);
        err.name = 'MastraDiscoveryError';
        err.details = toJson(errorDetails?.airlock);
        throw err;
      }
      return {
        instructions: mcp.getServerInstructions?.()?.airlock ?? null,
        protocolVersion: negotiatedFromWire(),
        definitions: toJson(definitions),
      };
    });
    if (!out.connect.ok) return;
    let tools = {};
    const listed = await stage('listTools', async () => {
      const r = await mcp.listToolsWithErrors();
      if (r.errors?.airlock !== undefined) throw Object.assign(new Error(r.errors.airlock), { details: toJson(r.errorDetails?.airlock) });
      tools = r.tools;
      return {};
    });
    if (!listed.ok) {
      out.listToolsError = listed.error;
      return;
    }
    const defs = out.connect.definitions?.airlock ?? {}; // listToolDefinitions(): {server: {tool: def}}
    out.tools = Object.entries(tools).map(([key, t]) => {
      const def = Object.values(defs).find((d) => `airlock_${d.name}` === key) ?? {};
      return {
        key, // Mastra's namespaced id: <server>_<tool>
        id: t.id,
        name: def.name ?? null,
        description: t.description,
        inputSchema: def.inputSchema ?? null, // raw JSON Schema as received
        outputSchema: def.outputSchema ?? null,
        annotations: t.mcp?.annotations ?? def.annotations ?? null,
        requireApproval: t.requireApproval ?? null,
      };
    });
    for (const call of calls) {
      const entry = { name: call.name, arguments: call.arguments ?? {} };
      const tool = tools[`airlock_${call.name}`];
      if (!tool) {
        entry.ok = false;
        entry.error = { message: `tool airlock_${call.name} not exposed by Mastra` };
      } else {
        Object.assign(
          entry,
          await stage('call', async () => ({ result: toJson(await tool.execute(entry.arguments, {})) })),
        );
      }
      out.calls.push(entry);
    }
  } finally {
    out.close = await stage('close', async () => {
      await mcp.disconnect();
      return {};
    });
  }
}

async function runSdkLegacy() {
  const { Client } = await import('@modelcontextprotocol/sdk/client/index.js');
  const { StreamableHTTPClientTransport } = await import('@modelcontextprotocol/sdk/client/streamableHttp.js');
  const { ElicitRequestSchema } = await import('@modelcontextprotocol/sdk/types.js');
  out.library = { name: '@modelcontextprotocol/sdk', version: pkgVersion('@modelcontextprotocol/sdk') };
  const client = new Client(
    { name: 'airlock-test-sdk-legacy', version: out.library.version },
    { capabilities: elicitationCapabilities() },
  );
  if (elicitationMode !== 'none') {
    client.setRequestHandler(ElicitRequestSchema, (req) => onElicitation('elicitation/create request', req.params));
  }
  const transport = new StreamableHTTPClientTransport(new URL(targetUrl), {
    requestInit: { headers: { ...authHeaders } },
    fetch: tracingFetch(),
  });
  await runSdkCommon(client, transport, { timeout: timeoutMs }, () => ({
    serverVersion: toJson(client.getServerVersion()),
    serverCapabilities: toJson(client.getServerCapabilities()),
    instructions: client.getInstructions() ?? null,
    protocolVersion: transport.protocolVersion ?? negotiatedFromWire(),
    sessionId: transport.sessionId ?? null,
  }));
}

async function runSdkV2({ legacy }) {
  const { Client, StreamableHTTPClientTransport } = await import('@modelcontextprotocol/client');
  out.library = { name: '@modelcontextprotocol/client', version: pkgVersion('@modelcontextprotocol/client') };
  const options = { capabilities: elicitationCapabilities() };
  if (legacy) {
    options.supportedProtocolVersions = ['2025-06-18'];
  } else {
    options.versionNegotiation = {
      mode: negotiation === 'auto' ? 'auto' : { pin: negotiation || '2026-07-28' },
      probe: { timeoutMs },
    };
    options.inputRequired = maxRounds === 0 ? { autoFulfill: false } : { autoFulfill: true, maxRounds };
  }
  const client = new Client({ name: `airlock-test-${scenario}`, version: out.library.version }, options);
  if (elicitationMode !== 'none') {
    client.setRequestHandler('elicitation/create', (req) =>
      onElicitation(legacy ? 'elicitation/create request' : 'input_required', req.params),
    );
  }
  const transport = new StreamableHTTPClientTransport(new URL(targetUrl), {
    requestInit: { headers: { ...authHeaders } },
    fetch: tracingFetch(),
  });
  const callOptions = { timeout: timeoutMs };
  if (!legacy && maxRounds === 0) callOptions.allowInputRequired = true;
  await runSdkCommon(client, transport, callOptions, () => ({
    era: client.getProtocolEra?.() ?? null,
    discover: toJson(client.getDiscoverResult?.() ?? null),
    serverVersion: toJson(client.getServerVersion()),
    serverCapabilities: toJson(client.getServerCapabilities()),
    instructions: client.getInstructions() ?? null,
    protocolVersion: negotiatedFromWire(),
    sessionId: transport.sessionId ?? null,
  }));
}

function negotiatedFromWire() {
  for (const e of out.http) {
    const body = e.responseBody?.sse ? e.responseBody.sse.find((m) => m?.result) : e.responseBody;
    if (e.requestBody?.method === 'initialize' && body?.result?.protocolVersion) return body.result.protocolVersion;
  }
  const later = out.http.map((e) => e.requestHeaders['mcp-protocol-version']).filter(Boolean);
  return later.length ? later[later.length - 1] : null;
}

async function runSdkCommon(client, transport, callOptions, describe) {
  try {
    out.connect = await stage('connect', async () => {
      await client.connect(transport, { timeout: timeoutMs });
      return describe();
    });
    if (!out.connect.ok) return;
    const listed = await stage('listTools', async () => ({ result: toJson(await client.listTools({}, { timeout: timeoutMs })) }));
    out.tools = listed.ok ? (listed.result.tools ?? []) : null;
    if (!listed.ok) out.listToolsError = listed.error;
    for (const call of calls) {
      const entry = { name: call.name, arguments: call.arguments ?? {} };
      Object.assign(entry, await callWithLegacyRetry(client, entry, callOptions));
      out.calls.push(entry);
    }
  } finally {
    out.close = await stage('close', async () => {
      await client.close();
      return {};
    });
  }
}

// tools/call; a -32042 (URL elicitation required, 2025-11-25) error is answered like a client
// would: surface each elicitation, then retry the same call (new JSON-RPC id) if accepted.
async function callWithLegacyRetry(client, entry, callOptions) {
  const attempts = [];
  const params = { name: entry.name, arguments: entry.arguments };
  // sdk 1.x: callTool(params, resultSchema?, options); client 2.x: callTool(params, options)
  const invoke = () =>
    scenario === 'sdk-legacy' ? client.callTool(params, undefined, callOptions) : client.callTool(params, callOptions);
  for (let round = 0; ; round++) {
    const r = await stage('call', async () => ({ result: toJson(await invoke()) }));
    attempts.push(r);
    const code = r.error?.code;
    const elicitations = r.error?.data?.elicitations ?? r.error?.elicitations;
    if (r.ok || code !== -32042 || !Array.isArray(elicitations)) break;
    let accepted = true;
    for (const el of elicitations) {
      const answer = await onElicitation('url_elicitation_required_error', el);
      if (answer.action !== 'accept') accepted = false;
    }
    if (!accepted || round >= maxRounds) break;
  }
  const last = attempts[attempts.length - 1];
  return { ...last, attempts: attempts.length > 1 ? attempts : undefined };
}

// ---- main -------------------------------------------------------------------------------------
let finished = false;
async function finish(exitCode) {
  if (finished) return;
  finished = true;
  await Promise.race([Promise.allSettled([...pendingBodies]), sleep(1000)]);
  out.wire = wireSummary();
  out.ok =
    !out.timedOut &&
    !!out.connect?.ok &&
    out.tools !== null &&
    out.calls.every((c) => c.ok) &&
    (out.close?.ok ?? true);
  realStdoutWrite(JSON.stringify(out) + '\n', () => process.exit(exitCode));
}

const watchdog = setTimeout(() => {
  out.timedOut = true;
  void finish(0);
}, deadlineMs);
watchdog.unref();

process.on('unhandledRejection', (e) => {
  // libraries sometimes reject background promises (e.g. an SSE GET answered 405); record them
  (out.unhandledRejections ??= []).push(serializeError(e));
});

try {
  if (scenario === 'mastra') await runMastra();
  else if (scenario === 'sdk-legacy') await runSdkLegacy();
  else if (scenario === 'sdk-legacy-2025-06-18') await runSdkV2({ legacy: true });
  else await runSdkV2({ legacy: false });
  await finish(0);
} catch (e) {
  out.crash = serializeError(e);
  process.stderr.write(`clients.mjs crashed: ${e?.stack ?? e}\n`);
  await finish(1);
}
