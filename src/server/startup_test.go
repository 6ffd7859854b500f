package server

import (
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/ratelimitd/ratelimit/src/settings"
)

func TestStoreSummaryNamesStoreWithoutCredentials(t *testing.T) {
	tests := []struct {
		name string
		give settings.Settings
		want string
	}{
		{name: "memory", give: settings.Settings{BackendType: "memory"}, want: "memory"},
		{name: "redis", give: settings.Settings{BackendType: "redis", RedisType: "SINGLE", RedisSocketType: "tcp", RedisURL: "redis:6379"},
			want: "redis single tcp redis:6379"},
		{name: "redis_url_with_password", give: settings.Settings{BackendType: "redis", RedisType: "SINGLE", RedisSocketType: "tcp", RedisURL: "redis://u:s3cret@redis:6379"},
			want: "redis single tcp redis://redis:6379"},
		{name: "sentinel_bare_userinfo", give: settings.Settings{BackendType: "redis", RedisType: "SENTINEL", RedisSocketType: "tcp", RedisURL: "mymaster,:s3cret@h1:26379,h2:26379"},
			want: "redis sentinel tcp mymaster,h1:26379,h2:26379"},
		{name: "memcache", give: settings.Settings{BackendType: "memcache", MemcacheHostPort: []string{"m1:11211", "m2:11211"}},
			want: "memcache m1:11211,m2:11211"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := storeSummary(&tt.give)
			if got != tt.want {
				t.Errorf("storeSummary = %q, want %q", got, tt.want)
			}
			if strings.Contains(got, "s3cret") {
				t.Errorf("storeSummary = %q shows the password", got)
			}
		})
	}
}

// TestNoRulesWarned: a rules directory without a rule file at start warns
// at the default level, naming the directory read, the settings that make
// it and the files there that do not load; one with rules does not. A
// rules directory that does not exist stops the start with an error
// naming those settings.
func TestNoRulesWarned(t *testing.T) {
	const warning = "no rules: the rules directory holds no rule file"
	t.Run("empty", func(t *testing.T) {
		var logs syncBuffer
		srv, root := build(t, "", map[string]string{"RUNTIME_SUBDIRECTORY": ""}, &logs)
		run(t, srv)
		got := logs.warnings(warning)
		if len(got) != 1 {
			t.Fatalf("warnings %q, want one %q", got, warning)
		}
		for _, want := range []string{"dir=" + filepath.Join(root, "config"), "RUNTIME_ROOT=" + root, `RUNTIME_SUBDIRECTORY=""`, "RUNTIME_APPDIRECTORY=config"} {
			if !strings.Contains(got[0], want) {
				t.Errorf("warning %q lacks %q", got[0], want)
			}
		}
	})
	t.Run("json_only", func(t *testing.T) {
		var logs syncBuffer
		root := t.TempDir()
		if err := os.MkdirAll(filepath.Join(root, "config"), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(root, "config", "rules.json"), []byte("{}"), 0o644); err != nil {
			t.Fatal(err)
		}
		run(t, buildIn(t, root, map[string]string{}, &logs))
		if got := logs.warnings(warning); len(got) != 1 || !strings.Contains(got[0], "not_rule_files=[rules.json]") {
			t.Errorf("warnings %q, want one naming rules.json", got)
		}
	})
	t.Run("rules", func(t *testing.T) {
		var logs syncBuffer
		srv, _ := build(t, serverRules, nil, &logs)
		run(t, srv)
		if got := logs.warnings(warning); len(got) != 0 {
			t.Errorf("warnings %q with rules, want none", got)
		}
	})
	t.Run("missing", func(t *testing.T) {
		setTestEnv(t, filepath.Join(t.TempDir(), "nowhere"), map[string]string{"RUNTIME_SUBDIRECTORY": "rl"})
		set, err := settings.Load()
		if err != nil {
			t.Fatal(err)
		}
		_, err = New(t.Context(), set, slog.New(slog.DiscardHandler))
		if err == nil {
			t.Fatal("New with no rules directory succeeded")
		}
		for _, want := range []string{"nowhere/rl/config", "RUNTIME_ROOT=", `RUNTIME_SUBDIRECTORY="rl"`, `RUNTIME_APPDIRECTORY="config"`} {
			if !strings.Contains(err.Error(), want) {
				t.Errorf("error %q lacks %q", err, want)
			}
		}
	})
}
