// The OpenID peer of Fairway's tests (see README.md beside this file): one node process on
// loopback serving
//
//   /idp/...   a real OpenID provider, panva's certified `oidc-provider`, with one client
//              (`fairway`) and in-memory accounts that sign in by name;
//   /ci/...    a CI system's token issuer, as GitHub Actions or GitLab CI run one: discovery,
//              JWKS, and GitHub's ID token request endpoint, signing with `jose`;
//   /test/...  controls for the tests: account groups, minting and rotating CI tokens.
//
// The harness copies this file beside the `node_modules` that `.ci/install-oidc-provider`
// installs and runs it there. Configuration comes from the environment:
//   OIDC_REDIRECT_URIS               comma-separated redirect URIs of client `fairway`
//   OIDC_POST_LOGOUT_REDIRECT_URIS   comma-separated post-logout redirect URIs (may be empty)
// Once listening it prints one line, `READY {"base":…,"issuer":…,"ci_issuer":…}`, to stdout;
// everything else goes to stderr. It exits when stdin closes or on SIGTERM.

import { randomBytes, randomUUID } from 'node:crypto';
import { createServer } from 'node:http';

import Provider from 'oidc-provider';
import { SignJWT, UnsecuredJWT, exportJWK, generateKeyPair } from 'jose';

// Stdout carries the READY line only; oidc-provider's notices (console.log/info) go to stderr.
console.log = console.error;
console.info = console.error;

const list = (name) => (process.env[name] || '').split(',').map((s) => s.trim()).filter(Boolean);
const log = (...args) => console.error('[oidc-peer]', ...args);

// --- Small HTTP helpers ------------------------------------------------------------------------

function send(res, status, body, type = 'application/json') {
  const text = body === undefined ? '' : type === 'application/json' ? JSON.stringify(body) : body;
  res.writeHead(status, { 'content-type': type, 'cache-control': 'no-store' });
  res.end(text);
}

async function readBody(req) {
  const chunks = [];
  for await (const chunk of req) chunks.push(chunk);
  return Buffer.concat(chunks).toString('utf8');
}

async function readJson(req) {
  const text = await readBody(req);
  return text ? JSON.parse(text) : {};
}

const htmlEscape = (s) => String(s).replace(/[&<>"']/g, (c) => `&#${c.charCodeAt(0)};`);

// --- Signing keys ------------------------------------------------------------------------------

// A fresh RSA key pair as `{ kid, privateKey, publicJwk, privateJwk }`.
async function newKey() {
  const { privateKey, publicKey } = await generateKeyPair('RS256', { extractable: true });
  const kid = randomUUID();
  const publicJwk = { ...(await exportJWK(publicKey)), kid, alg: 'RS256', use: 'sig' };
  const privateJwk = { ...(await exportJWK(privateKey)), kid, alg: 'RS256', use: 'sig' };
  return { kid, privateKey, publicJwk, privateJwk };
}

// --- Accounts ----------------------------------------------------------------------------------

// Groups per account id, set by `POST /test/accounts/:id`; any other id exists with none.
const groupsOf = new Map();

async function findAccount(ctx, id) {
  return {
    accountId: id,
    async claims() {
      return {
        sub: id,
        preferred_username: id,
        name: id,
        email: `${id}@example.test`,
        email_verified: true,
        groups: groupsOf.get(id) || [],
      };
    },
  };
}

// --- The OpenID provider -----------------------------------------------------------------------

// Grants whatever OpenID scopes and claims are requested, so consent needs no human: the
// session's grant for the client (or a new one) is widened and saved.
async function loadExistingGrant(ctx) {
  const { oidc } = ctx;
  const accountId = oidc.session.accountId;
  const grantId = oidc.result?.consent?.grantId || oidc.session.grantIdFor(oidc.client.clientId);
  let grant = grantId ? await oidc.provider.Grant.find(grantId) : undefined;
  if (!grant || grant.accountId !== accountId) {
    grant = new oidc.provider.Grant({ clientId: oidc.client.clientId, accountId });
  }
  grant.addOIDCScope(oidc.requestParamOIDCScopes);
  if (oidc.requestParamClaims.size) grant.addOIDCClaims(oidc.requestParamClaims);
  await grant.save();
  return grant;
}

// The RP-initiated logout confirmation: oidc-provider's form (it carries the xsrf token) with a
// visible "Sign out" button, submitted at once by a script so a browser goes straight on to
// the post-logout redirect URI.
async function logoutSource(ctx, form) {
  const button = '<button type="submit" name="logout" value="yes">Sign out</button>';
  ctx.type = 'html';
  ctx.body = `<!DOCTYPE html>
<html><head><meta charset="utf-8"><title>Sign out</title></head>
<body>
${form.replace('</form>', `${button}</form>`)}
<script>
  const form = document.getElementById('op.logoutForm');
  form.requestSubmit(form.querySelector('button[name="logout"]'));
</script>
</body></html>`;
}

function createProvider(issuer, signingKey) {
  const provider = new Provider(issuer, {
    clients: [{
      client_id: 'fairway',
      client_secret: 'fairway-secret',
      token_endpoint_auth_method: 'client_secret_basic',
      grant_types: ['authorization_code'],
      response_types: ['code'],
      redirect_uris: list('OIDC_REDIRECT_URIS'),
      post_logout_redirect_uris: list('OIDC_POST_LOGOUT_REDIRECT_URIS'),
    }],
    jwks: { keys: [signingKey.privateJwk] },
    // Every client must use PKCE (oidc-provider supports S256 only).
    pkce: { required: () => true },
    claims: {
      openid: ['sub'],
      profile: ['preferred_username', 'name'],
      email: ['email', 'email_verified'],
      groups: ['groups'],
    },
    // Scope claims go into the ID token too, not only userinfo: Fairway reads groups there.
    conformIdTokenClaims: false,
    // Lifetimes in seconds (the defaults', made explicit to quiet oidc-provider's notices).
    ttl: { AccessToken: 3600, AuthorizationCode: 60, IdToken: 3600, Interaction: 3600, Grant: 3600, Session: 3600 },
    findAccount,
    loadExistingGrant,
    interactions: { url: (ctx, interaction) => `/idp/interaction/${interaction.uid}` },
    // Signed cookies; not `secure`, which oidc-provider sets only on https requests anyway.
    cookies: { keys: [randomBytes(32).toString('hex')] },
    features: {
      devInteractions: { enabled: false },
      rpInitiatedLogout: { enabled: true, logoutSource },
    },
    // Errors as a plain page showing every field of the error (the default hides some).
    renderError(ctx, out) {
      ctx.type = 'html';
      ctx.body = `<!DOCTYPE html><html><body><h1>${htmlEscape(out.error)}</h1>`
        + `<pre>${htmlEscape(JSON.stringify(out, null, 2))}</pre></body></html>`;
    },
  });
  provider.on('server_error', (ctx, err) => log('server_error', err));
  provider.on('grant.error', (ctx, err) => log('grant.error', err.message));
  provider.on('authorization.error', (ctx, err) => log('authorization.error', err.message));
  return provider;
}

// Our interaction pages, at `/idp/interaction/:uid[/login]`: a login form that signs in as
// whatever account name is typed, and consent granted without asking (should the consent
// prompt ever come up; `loadExistingGrant` normally makes it unnecessary).
async function interaction(provider, req, res, uid, action) {
  const details = await provider.interactionDetails(req, res);
  const { prompt } = details;
  if (prompt.name === 'login' && req.method === 'GET' && !action) {
    return send(res, 200, `<!DOCTYPE html>
<html><head><meta charset="utf-8"><title>Sign in</title></head>
<body>
<h1>Sign in to the test OpenID provider</h1>
<form method="post" action="/idp/interaction/${htmlEscape(uid)}/login">
<input name="login" autofocus><button type="submit">Sign in</button>
</form>
</body></html>`, 'text/html; charset=utf-8');
  }
  if (prompt.name === 'login' && req.method === 'POST' && action === 'login') {
    const login = new URLSearchParams(await readBody(req)).get('login');
    if (!login) return send(res, 400, { error: 'login is required' });
    return provider.interactionFinished(req, res, { login: { accountId: login } }, { mergeWithLastSubmission: false });
  }
  if (prompt.name === 'consent') {
    const grant = details.grantId
      ? await provider.Grant.find(details.grantId)
      : new provider.Grant({ accountId: details.session.accountId, clientId: details.params.client_id });
    if (prompt.details.missingOIDCScope) grant.addOIDCScope(prompt.details.missingOIDCScope);
    if (prompt.details.missingOIDCClaims) grant.addOIDCClaims(prompt.details.missingOIDCClaims);
    const grantId = await grant.save();
    return provider.interactionFinished(req, res, { consent: { grantId } }, { mergeWithLastSubmission: true });
  }
  return send(res, 400, { error: `unexpected ${req.method} for prompt ${prompt.name}` });
}

// --- The CI issuer -----------------------------------------------------------------------------

const ci = {
  keys: [], // every key published in the JWKS, newest last
  current: undefined, // the key tokens are signed with
  foreign: undefined, // a key never published
  github: undefined, // { requestToken, claims } armed by POST /test/ci/github
};

// A CI ID token: GitHub-like default claims, `request.claims` merged over them.
async function ciToken(ciIssuer, request) {
  const now = Math.floor(Date.now() / 1000);
  const claims = {
    iss: request.issuer ?? ciIssuer,
    aud: request.audience ?? 'fairway',
    sub: 'repo:acme/train:ref:refs/heads/main',
    repository: 'acme/train',
    ref: 'refs/heads/main',
    environment: 'production',
    iat: now,
    nbf: now,
    exp: now + (request.expires_in ?? 300),
    jti: randomUUID(),
    ...(request.claims || {}),
  };
  if (request.alg === 'none') return new UnsecuredJWT(claims).encode();
  const key = request.key === 'foreign' ? ci.foreign : ci.current;
  return new SignJWT(claims).setProtectedHeader({ alg: 'RS256', kid: key.kid, typ: 'JWT' }).sign(key.privateKey);
}

// --- The server --------------------------------------------------------------------------------

async function main() {
  const idpKey = await newKey();
  ci.current = await newKey();
  ci.keys.push(ci.current);
  ci.foreign = await newKey();

  let provider;
  let base;
  let ciIssuer;

  const server = createServer(async (req, res) => {
    const url = new URL(req.url, base);
    const path = url.pathname;
    try {
      // Our own interaction pages come first; everything else under /idp is the provider's,
      // which sees the path without the prefix and finds its mount point from `originalUrl`.
      const inter = path.match(/^\/idp\/interaction\/([^/]+)(?:\/(login))?$/);
      if (inter) return await interaction(provider, req, res, inter[1], inter[2]);
      if (path === '/idp' || path.startsWith('/idp/')) {
        req.originalUrl = req.url;
        req.url = req.url.slice('/idp'.length) || '/';
        return provider.callback()(req, res);
      }

      const account = path.match(/^\/test\/accounts\/([^/]+)$/);
      if (account && req.method === 'POST') {
        const { groups = [] } = await readJson(req);
        groupsOf.set(decodeURIComponent(account[1]), groups);
        return send(res, 204);
      }
      if (path === '/ci/.well-known/openid-configuration' && req.method === 'GET') {
        return send(res, 200, {
          issuer: ciIssuer,
          jwks_uri: `${ciIssuer}/jwks`,
          id_token_signing_alg_values_supported: ['RS256'],
          response_types_supported: ['id_token'],
          subject_types_supported: ['public'],
        });
      }
      if (path === '/ci/jwks' && req.method === 'GET') {
        return send(res, 200, { keys: ci.keys.map((k) => k.publicJwk) });
      }
      if (path === '/test/ci/token' && req.method === 'POST') {
        return send(res, 200, { token: await ciToken(ciIssuer, await readJson(req)) });
      }
      if (path === '/test/ci/rotate' && req.method === 'POST') {
        ci.current = await newKey();
        ci.keys.push(ci.current);
        return send(res, 200, { kid: ci.current.kid });
      }
      if (path === '/test/ci/github' && req.method === 'POST') {
        const { request_token: requestToken, claims = {} } = await readJson(req);
        ci.github = { requestToken, claims };
        return send(res, 204);
      }
      // GitHub Actions' ACTIONS_ID_TOKEN_REQUEST_URL: `Authorization: bearer <request token>`,
      // `audience` in the query (GitHub's default: the owner's URL), `{"value": <jwt>}` back.
      if (path === '/ci/github' && req.method === 'GET') {
        const [scheme, token] = (req.headers.authorization || '').split(' ');
        if (!ci.github?.requestToken || scheme?.toLowerCase() !== 'bearer' || token !== ci.github.requestToken) {
          return send(res, 401, { message: 'Bad credentials' });
        }
        const claims = { repository: 'acme/train', ...ci.github.claims };
        const audience = url.searchParams.get('audience')
          || `https://github.com/${String(claims.repository).split('/')[0]}`;
        return send(res, 200, { value: await ciToken(ciIssuer, { claims, audience }) });
      }
      return send(res, 404, { error: `no route ${req.method} ${path}` });
    } catch (err) {
      log(`${req.method} ${path}:`, err);
      if (!res.headersSent) send(res, 500, { error: String(err?.message || err) });
      else res.end();
    }
  });

  server.listen(0, '127.0.0.1', () => {
    base = `http://127.0.0.1:${server.address().port}`;
    ciIssuer = `${base}/ci`;
    provider = createProvider(`${base}/idp`, idpKey);
    process.stdout.write(`READY ${JSON.stringify({ base, issuer: `${base}/idp`, ci_issuer: ciIssuer })}\n`);
  });
}

// The harness holds our stdin open for as long as the test runs.
process.stdin.on('end', () => process.exit(0));
process.stdin.on('close', () => process.exit(0));
process.stdin.resume();
process.on('SIGTERM', () => process.exit(0));

main().catch((err) => {
  log(err);
  process.exit(1);
});
