// The OpenID provider of the openid-connect login-flow test: npm's oidc-provider (a certified
// OpenID Connect implementation) on 127.0.0.1:<port>, with one confidential client. Its
// interaction step logs the user "alice" in and grants what the client asked for without a
// form, so the test drives the flow as a browser would, redirect by redirect. Prints
// "listening" once it accepts connections.
//
// node provider.mjs <port> <client_id> <client_secret> <redirect_uri,...> <post_logout_redirect_uri>
import Provider from 'oidc-provider';

const [port, clientId, clientSecret, redirectUris, postLogout] = process.argv.slice(2);
const issuer = `http://127.0.0.1:${port}`;

const provider = new Provider(issuer, {
  clients: [{
    client_id: clientId,
    client_secret: clientSecret,
    redirect_uris: redirectUris.split(','),
    post_logout_redirect_uris: [postLogout],
    grant_types: ['authorization_code', 'refresh_token'],
    response_types: ['code'],
    token_endpoint_auth_method: 'client_secret_basic',
  }],
  features: {
    devInteractions: { enabled: false },
    revocation: { enabled: true },
    introspection: { enabled: true },
    rpInitiatedLogout: {
      enabled: true,
      // The bare form (its xsrf field), for the test to submit.
      logoutSource: async (ctx, form) => { ctx.body = `<html><body>${form}</body></html>`; },
    },
  },
  // A refresh token for every code grant (by default only with the offline_access scope).
  issueRefreshToken: async (ctx, client) => client.grantTypeAllowed('refresh_token'),
  claims: { openid: ['sub'], email: ['email', 'email_verified'], profile: ['name'] },
  findAccount: async (ctx, sub) => ({
    accountId: sub,
    claims: async () => ({ sub, email: `${sub}@example.com`, email_verified: true, name: 'Alice' }),
  }),
  cookies: { keys: ['ferrisix-oidc-test-cookie-key'] },
});

provider.use(async (ctx, next) => {
  if (!/^\/interaction\/[^/]+$/.test(ctx.path)) {
    return next();
  }
  const details = await provider.interactionDetails(ctx.req, ctx.res);
  const { prompt, params, session } = details;
  let result;
  if (prompt.name === 'login') {
    result = { login: { accountId: 'alice' } };
  } else {
    const grant = details.grantId
      ? await provider.Grant.find(details.grantId)
      : new provider.Grant({ accountId: session.accountId, clientId: params.client_id });
    const missing = prompt.details;
    if (missing.missingOIDCScope) grant.addOIDCScope(missing.missingOIDCScope.join(' '));
    if (missing.missingOIDCClaims) grant.addOIDCClaims(missing.missingOIDCClaims);
    for (const [indicator, scopes] of Object.entries(missing.missingResourceScopes || {})) {
      grant.addResourceScope(indicator, scopes.join(' '));
    }
    result = { consent: { grantId: await grant.save() } };
  }
  const to = await provider.interactionResult(ctx.req, ctx.res, result, { mergeWithLastSubmission: true });
  ctx.status = 303;
  ctx.redirect(to);
});

provider.listen(Number(port), '127.0.0.1', () => {
  console.log('listening');
});
