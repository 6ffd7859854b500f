package server

import (
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
