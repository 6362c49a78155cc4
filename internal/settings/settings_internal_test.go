package settings

import (
	"slices"
	"strings"
	"testing"
)

// TestDevTopics: DEV_TOPICS takes a list of topic names, blanks around them ignored, and refuses a
// name Kafka refuses and more than 100 topics.
func TestDevTopics(t *testing.T) {
	t.Parallel()
	var got []string
	if err := parseTopicList(&got, " orders.created, ,shipments "); err != nil || !slices.Equal(got, []string{"orders.created", "shipments"}) {
		t.Errorf("parseTopicList = %v, %v; want [orders.created shipments]", got, err)
	}
	many := strings.Repeat("t,", maxDevTopics) + "t"
	for _, bad := range []string{"orders created", "a/b", many} {
		if err := parseTopicList(&got, bad); err == nil {
			t.Errorf("parseTopicList(%.40q) accepted it", bad)
		}
	}
}
