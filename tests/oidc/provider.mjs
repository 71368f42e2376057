// A real OpenID provider for the login tests (the certified oidc-provider), configured from
// the environment by tests/helpers/oidc.py: OIDC_PORT, OIDC_CLIENT (JSON: client_id,
// client_secret, redirect_uris, post_logout_redirect_uris) and OIDC_ACCOUNTS_FILE (JSON: id →
// claims, read at each login). Its login page is the package's development one (any known
// account, no password): the platform's side, not the provider's, is under test.
import { readFileSync } from 'node:fs';
import Provider from 'oidc-provider';

const port = Number(process.env.OIDC_PORT);
const client = JSON.parse(process.env.OIDC_CLIENT);
const accounts = () => JSON.parse(readFileSync(process.env.OIDC_ACCOUNTS_FILE, 'utf8'));

const provider = new Provider(`http://127.0.0.1:${port}`, {
  clients: [{
    ...client,
    grant_types: ['authorization_code'],
    response_types: ['code'],
    token_endpoint_auth_method: 'client_secret_basic',
  }],
  cookies: { keys: ['test-provider-cookie-key'] },
  claims: {
    openid: ['sub'],
    email: ['email', 'email_verified'],
    profile: ['name', 'given_name', 'family_name', 'preferred_username'],
    groups: ['groups'],
  },
  features: { devInteractions: { enabled: true } },
  pkce: { required: () => true },
  async findAccount(ctx, id) {
    if (!accounts()[id]) return undefined;
    return {
      accountId: id,
      async claims() { return { sub: id, email_verified: true, ...accounts()[id] }; },
    };
  },
  // The platform is a first-party client: consent is given without asking.
  async loadExistingGrant(ctx) {
    const grantId = ctx.oidc.result?.consent?.grantId
      || ctx.oidc.session.grantIdFor(ctx.oidc.client.clientId);
    if (grantId) return ctx.oidc.provider.Grant.find(grantId);
    const grant = new ctx.oidc.provider.Grant({
      clientId: ctx.oidc.client.clientId, accountId: ctx.oidc.session.accountId,
    });
    grant.addOIDCScope('openid email profile groups');
    await grant.save();
    return grant;
  },
});
provider.listen(port, '127.0.0.1', () => console.log('ready'));
