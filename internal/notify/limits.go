package notify

import (
	"cmp"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/inboxworker/inboxworker/internal/envflag"
)

// Bounds of the traffic settings (SMS_VALIDITY, SMS_RECIPIENT_LIMIT): what lies outside them no
// deployment means.
const (
	// MinValidity and MaxValidity bound a template's validity: under a second an SMS expires on
	// its way to the worker; a code valid for over a week is no code.
	MinValidity, MaxValidity = time.Second, 7 * 24 * time.Hour
	// MinWindow and MaxWindow bound the period of a recipient limit's window: counts are kept for
	// the longest, so a month is as far as they go.
	MinWindow, MaxWindow = time.Second, 30 * 24 * time.Hour
	// MaxWindowCount bounds the SMS one window lets through to one recipient.
	MaxWindowCount = 10000
	// MaxWindows bounds the windows of one template.
	MaxWindows = 8
	// MaxLimitedTemplates bounds the templates one setting names.
	MaxLimitedTemplates = 1000
)

// Validity is how long after it was produced an SMS of each template is still worth sending
// (SMS_VALIDITY); an SMS of a template it does not name never expires, unless its event says when
// (expires_at).
type Validity map[string]time.Duration

// ParseValidity parses a validity per template, "verify_code=5m,login_code=2m": comma-separated
// TEMPLATE=DURATION entries, a duration as Go writes it, from MinValidity to MaxValidity, each
// template once. Spaces around the parts are ignored; "" is no validity at all (nil).
func ParseValidity(s string) (Validity, error) {
	entries, err := templateEntries(s)
	if err != nil || entries == nil {
		return nil, err
	}
	v := Validity{}
	for template, raw := range entries {
		d, err := time.ParseDuration(raw)
		switch {
		case err != nil:
			return nil, fmt.Errorf("%s: invalid duration %q (use 30s, 5m, 2h)", template, raw)
		case d < MinValidity || d > MaxValidity:
			return nil, fmt.Errorf("%s: must be from %s to %s, got %q", template,
				envflag.FormatDuration(MinValidity), envflag.FormatDuration(MaxValidity), raw)
		}
		v[template] = d
	}
	return v, nil
}

// String writes v as ParseValidity reads it, its templates in order.
func (v Validity) String() string {
	entries := make([]string, 0, len(v))
	for _, template := range slices.Sorted(maps.Keys(v)) {
		entries = append(entries, template+"="+envflag.FormatDuration(v[template]))
	}
	return strings.Join(entries, ",")
}

// A Window is one limit of SMS to one recipient: at most Count in any Period.
type Window struct {
	Count  int
	Period time.Duration
}

// RecipientLimits are the windows of each template (SMS_RECIPIENT_LIMIT): an SMS of a template
// named is sent only while every window of it has room for one more to its recipient; a template
// not named has no limit.
type RecipientLimits map[string][]Window

// ParseRecipientLimits parses windows per template, "verify_code=1/1m;5/1h;10/24h,login_code=3/10m":
// comma-separated TEMPLATE=WINDOWS entries, each template once, its windows COUNT/PERIOD separated
// by ';': a count from 1 to MaxWindowCount, a period as Go writes a duration, from MinWindow to
// MaxWindow, at most MaxWindows of them and no period twice. Spaces around the parts are ignored;
// "" is no limit at all (nil). The windows of each template are returned shortest first.
func ParseRecipientLimits(s string) (RecipientLimits, error) {
	entries, err := templateEntries(s)
	if err != nil || entries == nil {
		return nil, err
	}
	l := RecipientLimits{}
	for template, raw := range entries {
		windows, err := parseWindows(raw)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", template, err)
		}
		l[template] = windows
	}
	return l, nil
}

// parseWindows parses the windows of one template, "1/1m;5/1h".
func parseWindows(s string) ([]Window, error) {
	parts := strings.Split(s, ";")
	if len(parts) > MaxWindows {
		return nil, fmt.Errorf("at most %d windows, got %d", MaxWindows, len(parts))
	}
	var windows []Window
	for _, part := range parts {
		part = strings.TrimSpace(part)
		count, period, ok := strings.Cut(part, "/")
		if !ok {
			return nil, fmt.Errorf("want COUNT/PERIOD (1/1m), got %q", part)
		}
		var w Window
		var err error
		w.Count, err = strconv.Atoi(strings.TrimSpace(count))
		if err != nil || w.Count < 1 || w.Count > MaxWindowCount || strings.HasPrefix(strings.TrimSpace(count), "+") {
			return nil, fmt.Errorf("a count must be from 1 to %d, got %q", MaxWindowCount, strings.TrimSpace(count))
		}
		raw := strings.TrimSpace(period)
		if w.Period, err = time.ParseDuration(raw); err != nil {
			return nil, fmt.Errorf("invalid period %q (use 1m, 1h, 24h)", raw)
		}
		if w.Period < MinWindow || w.Period > MaxWindow {
			return nil, fmt.Errorf("a period must be from %s to %s, got %q",
				envflag.FormatDuration(MinWindow), envflag.FormatDuration(MaxWindow), raw)
		}
		if slices.ContainsFunc(windows, func(o Window) bool { return o.Period == w.Period }) {
			return nil, fmt.Errorf("two windows of %s", envflag.FormatDuration(w.Period))
		}
		windows = append(windows, w)
	}
	slices.SortFunc(windows, func(a, b Window) int { return cmp.Compare(a.Period, b.Period) })
	// A window allowing as many as a longer one never binds: every stretch of its period lies in
	// one of the longer period, which is full first. Written so, it is a mistake (5/30s for 5/30m?).
	for i, w := range windows {
		for _, longer := range windows[i+1:] {
			if w.Count >= longer.Count {
				return nil, fmt.Errorf("%d/%s never binds: %d/%s allows fewer", w.Count, envflag.FormatDuration(w.Period),
					longer.Count, envflag.FormatDuration(longer.Period))
			}
		}
	}
	return windows, nil
}

// String writes l as ParseRecipientLimits reads it, its templates in order.
func (l RecipientLimits) String() string {
	entries := make([]string, 0, len(l))
	for _, template := range slices.Sorted(maps.Keys(l)) {
		windows := make([]string, len(l[template]))
		for i, w := range l[template] {
			windows[i] = strconv.Itoa(w.Count) + "/" + envflag.FormatDuration(w.Period)
		}
		entries = append(entries, template+"="+strings.Join(windows, ";"))
	}
	return strings.Join(entries, ",")
}

// longest is the longest period of windows, which are shortest first.
func longest(windows []Window) time.Duration { return windows[len(windows)-1].Period }

// templateEntries splits "a=x,b=y" into its values by template: nil for "".
func templateEntries(s string) (map[string]string, error) {
	if strings.TrimSpace(s) == "" {
		return nil, nil
	}
	parts := strings.Split(s, ",")
	if len(parts) > MaxLimitedTemplates {
		return nil, fmt.Errorf("at most %d templates, got %d", MaxLimitedTemplates, len(parts))
	}
	entries := make(map[string]string, len(parts))
	for _, part := range parts {
		template, value, ok := strings.Cut(part, "=")
		template, value = strings.TrimSpace(template), strings.TrimSpace(value)
		switch {
		case strings.TrimSpace(part) == "":
			return nil, errors.New("an empty entry (a comma too many?)")
		case !ok || value == "":
			return nil, fmt.Errorf("want TEMPLATE=VALUE, got %q", strings.TrimSpace(part))
		case !validName(template, MaxTemplateLen):
			return nil, fmt.Errorf("%q is not a template name (1 to %d characters of A-Z, a-z, 0-9, '_', '.', '-')",
				template, MaxTemplateLen)
		}
		if _, dup := entries[template]; dup {
			return nil, fmt.Errorf("%s is given twice", template)
		}
		entries[template] = value
	}
	return entries, nil
}
