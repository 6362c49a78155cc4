// Package redact hides secrets in text bound for logs, errors and the startup line: passwords and
// query values of URLs, and any secret the caller names (a SASL password, a provider token).
//
// It does not decide what is secret (the settings do) and does not mask phone numbers: package
// notify does, for the messages it reads.
package redact

import (
	"maps"
	"net/url"
	"regexp"
	"slices"
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
	urlQuery    = regexp.MustCompile(`([?&][^=&#]*=)[^&#]*`)
)

// shownQueryParams are the query parameters whose values URL shows: Postgres connection
// parameters that are never secret. Any other value may be one (an SMS gateway's api_key, a
// signature, sslpassword) and is masked.
var shownQueryParams = map[string]bool{
	"sslmode": true, "user": true, "host": true, "port": true, "dbname": true, "application_name": true,
	"connect_timeout": true, "target_session_attrs": true, "search_path": true, "sslrootcert": true,
	"pool_max_conns": true, "pool_min_conns": true, "default_query_exec_mode": true,
}

// URL masks what a URL may carry of a secret: the password of its user info and every query value
// but those of shownQueryParams; in a key=value connection string, its passwords. It works on
// strings that do not parse, too.
func URL(s string) string {
	if s == "" {
		return ""
	}
	if u, err := url.Parse(s); err == nil && u.Scheme != "" {
		if _, has := u.User.Password(); has {
			u.User = url.UserPassword(u.User.Username(), Mask)
		}
		if u.RawQuery != "" {
			u.RawQuery = maskQuery(u.RawQuery)
		}
		return u.String()
	}
	s = urlPassword.ReplaceAllString(s, "${1}"+Mask+"@")
	if strings.Contains(s, "://") {
		s = urlQuery.ReplaceAllString(s, "${1}"+Mask)
	}
	return kvPassword.ReplaceAllString(s, "${1}"+Mask)
}

// maskQuery returns a URL's query, sorted by name, with every value masked but those of
// shownQueryParams, and a name without a value (which may be a key itself, as in ?K3Y) masked whole.
func maskQuery(rawQuery string) string {
	q, err := url.ParseQuery(rawQuery)
	if err != nil {
		return Mask
	}
	parts := make([]string, 0, len(q))
	for _, name := range slices.Sorted(maps.Keys(q)) {
		for _, v := range q[name] {
			switch {
			case shownQueryParams[strings.ToLower(name)]:
				parts = append(parts, url.QueryEscape(name)+"="+url.QueryEscape(v))
			case v == "":
				parts = append(parts, Mask)
			default:
				parts = append(parts, url.QueryEscape(name)+"="+Mask)
			}
		}
	}
	return strings.Join(parts, "&")
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
