"""`Authorization: Token <key>` for the REST API."""

from rest_framework import authentication, exceptions

from accounts.services import api_token_authenticate


class TokenAuthentication(authentication.TokenAuthentication):
    keyword = "Token"

    def authenticate_credentials(self, key):
        token = api_token_authenticate(key=key)
        if token is None:
            raise exceptions.AuthenticationFailed("invalid or revoked token")
        return (token.user, token)
