package server

import (
	"github.com/ratelimitd/ratelimit/src/live/web"
)

// liveSource tells the live view where the rules in use came from, as
// /rlconfig's header does.
func (s *Server) liveSource() web.Source {
	var src web.Source
	if snap := s.snapshot.Load(); snap != nil {
		src.Kind, src.Location, src.Version = snap.Source.Kind, snap.Source.Location, snap.Source.Version
		src.LoadedAt = snap.Source.LoadedAt
	}
	if e := s.reloadErr.Load(); e != nil {
		src.LastError, src.LastErrorAt = e.err.Error(), e.at
	}
	return src
}

// liveStore tells the live view the store's state.
func (s *Server) liveStore() web.Store {
	st := web.Store{Backend: s.set.BackendType, Healthy: s.store.healthy()}
	if s.store.breakers != nil {
		b := s.store.breakers()
		st.Breakers = &web.Breakers{Open: b.Open, Trips: b.Trips, Rejections: b.Rejections}
	}
	if s.nearCache != nil {
		st.NearCache = &web.NearCache{Entries: s.nearCache.Len()}
	}
	return st
}
