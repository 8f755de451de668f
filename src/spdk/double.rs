pub struct SpdkDouble;
