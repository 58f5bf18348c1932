class ByteLevel:
    @staticmethod
    def alphabet():
        return []
