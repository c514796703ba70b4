package mcpserver

// Placeholders replaced by the tool files being written.
func (s *Server) controlPlaneTools() []tool { return nil }
func (s *Server) eventTools() []tool        { return nil }
func (s *Server) logTools() []tool          { return nil }
func (s *Server) healthTools() []tool       { return nil }
