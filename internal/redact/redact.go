// Package redact hides secrets in text bound for logs, errors and the startup line: passwords in
// connection strings, and any secret the caller names (a SASL password, a provider token).
//
// It does not decide what is secret (the settings do) and does not mask phone numbers: package
// notify does, for the messages it reads.
package redact

import (
	"net/url"
	"regexp"
	"strings"
)

// Mask is what a secret is replaced with.
const Mask = "xxxxx"

// Secret is Mask for a set secret, and "" for an unset one, so that the startup line still tells
// the two apart.
func Secret(s string) string {
	if s == "" {
		return ""
	}
	return Mask
}

// Scrubber returns a function that replaces every occurrence of each non-empty secret in a text.
func Scrubber(secrets ...string) func(string) string {
	return func(s string) string {
		for _, secret := range secrets {
			if secret != "" {
				s = strings.ReplaceAll(s, secret, Mask)
			}
		}
		return s
	}
}

var (
	urlPassword = regexp.MustCompile(`(://[^:/?#@]*:)[^@]*@`)
	kvPassword  = regexp.MustCompile(`(?i)((?:ssl)?password=)('[^']*'|[^ &]*)`)
)

// URL masks every password a connection string may carry: in its user info and in password
// parameters. It works on strings that do not parse, too.
func URL(s string) string {
	if s == "" {
		return ""
	}
	if u, err := url.Parse(s); err == nil && u.Scheme != "" {
		if _, has := u.User.Password(); has {
			u.User = url.UserPassword(u.User.Username(), Mask)
		}
		q := u.Query()
		masked := false
		for k := range q {
			if strings.EqualFold(k, "password") || strings.EqualFold(k, "sslpassword") {
				q.Set(k, Mask)
				masked = true
			}
		}
		if masked {
			u.RawQuery = q.Encode()
		}
		return u.String()
	}
	s = urlPassword.ReplaceAllString(s, "${1}"+Mask+"@")
	return kvPassword.ReplaceAllString(s, "${1}"+Mask)
}

// pgxQuotedConnString is how pgx quotes the connection string in its errors.
var pgxQuotedConnString = regexp.MustCompile("cannot parse `[^`]*`: ")

// PgxConfigError is why pgx refused connString, without the connection string (and so without
// its password) that pgx's own messages repeat.
func PgxConfigError(err error, connString string) string {
	reason := err.Error()
	if p, _ := url.Parse(connString); p != nil {
		if password, ok := p.User.Password(); ok && password != "" {
			reason = strings.ReplaceAll(reason, password, Mask)
		}
	}
	return pgxQuotedConnString.ReplaceAllString(reason, "")
}
