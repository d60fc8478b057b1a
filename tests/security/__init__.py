"""The security suite: the checks that prove the platform's posture, run by `make test`.

- test_settings.py: production is the default everywhere, refuses to start without a key, and
  Django's deploy check passes under it (CI also runs `make deploy-check`).
- test_csp_browser.py: the Content-Security-Policy, and the pages working under it in Chromium.
- test_access_matrix.py: every route (HTTP, websocket, SSE) against six callers.
- test_token_admin.py: no impersonation through the token admin; admin actions declare permissions.
- test_client_address.py: the ledger's address cannot be forged through X-Forwarded-For.
- test_input_limits.py: body size, JSON depth, comment and reason lengths, demo schema strings.
- test_health_detail.py, test_job_errors.py, test_webhook_response_caps.py, test_small_items.py:
  what the probes tell strangers, tracebacks, webhook answers, help text, CSV, passwords, sign-in.
- test_dependencies.py: the hashed lock the image installs, in step with requirements.txt.
- test_tickets_and_redaction.py: websockets take single-use tickets, never an API key in the URL;
  a real server's log holds no key, ticket or wake token.
- tests/live/test_streams.py (beside the other live-stream tests): open streams re-checked and
  closed on revocation or deactivation, the per-user cap.
"""
